#include "state.h"

atomic_int ema__state = EMA_STATE_NONE;
