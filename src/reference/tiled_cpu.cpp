#include "reference/tiled_cpu.h"
