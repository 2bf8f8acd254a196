/* cddp/cddp.h: everything. Include this, link with -lcddp (pkg-config --libs cddp). */
#ifndef CDDP_CDDP_H
#define CDDP_CDDP_H

#include "cddp/core.h"
#include "cddp/tensor.h"
#include "cddp/autograd.h"
#include "cddp/nn.h"
#include "cddp/optim.h"
#include "cddp/checkpoint.h"
#include "cddp/summary.h"
#include "cddp/data.h"
#include "cddp/launch.h"
#include "cddp/net.h"
#include "cddp/store.h"
#include "cddp/comm.h"
#include "cddp/flight.h"
#include "cddp/stop.h"
#include "cddp/ddp.h"
#include "cddp/dcomm.h"

#endif
