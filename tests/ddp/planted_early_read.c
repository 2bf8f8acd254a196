/* planted_early_read.c: DDP's staging (src/ddp/stage.c) with a bug planted, for the test that must
 * catch it: the reduction no longer waits for the event after its bucket's copy to the host, so
 * it reads the host copy before the device has written it. Linked before the library, this
 * stage.c takes the place of the library's own. */
#include "ddp/internal.h"

#define cddp_event_synchronize(event, err) ((void)(event), (void)(err), CDDP_OK)
#include "../../src/ddp/stage.c"
