#include "reference/cuda_reference.h"
