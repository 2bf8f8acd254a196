/* cddp/net.h: TCP helpers with deadlines: the store, the TCP transport and cddprun use them.
 *
 * Every call that can block takes an absolute deadline in cddp_now_s() seconds (a negative
 * deadline waits forever), and EINTR and short reads/writes are handled here, once. Errors name
 * the address and what to check.
 */
#ifndef CDDP_NET_H
#define CDDP_NET_H

#include "cddp/core.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Listens on host:port (port 0: any free port; *bound receives the port). Binds to host's
 * address only, never to every interface. EADDRINUSE gives the "already in use" message. */
CDDP_API int cddp_net_listen(const char *host, int port, int *fd, int *bound, cddp_error *err);
/* Connects to host:port, retrying name resolution and refused connections until the deadline.
 * The socket is blocking with TCP_NODELAY. local (may be NULL) binds the source address. */
CDDP_API int cddp_net_connect(const char *host, int port, const char *local, double deadline,
                              int *fd, cddp_error *err);
CDDP_API int cddp_net_write_all(int fd, const void *buf, size_t n, double deadline,
                                cddp_error *err);
/* Reads exactly n bytes; a peer that closes first is CDDP_EIO ("closed the connection"). */
CDDP_API int cddp_net_read_all(int fd, void *buf, size_t n, double deadline, cddp_error *err);
/* Sets O_NONBLOCK and TCP_NODELAY. */
CDDP_API void cddp_net_nonblocking(int fd);
/* Milliseconds until deadline for poll(): -1 for none, 0 when past. */
CDDP_API int cddp_net_poll_ms(double deadline);

#ifdef __cplusplus
}
#endif
#endif
