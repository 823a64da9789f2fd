#include "fa3/cpu.h"
