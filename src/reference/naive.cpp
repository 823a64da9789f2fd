#include "reference/naive.h"
