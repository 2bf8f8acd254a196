/* comm/tcp.h: the TCP transport's state and what its files share.
 *
 * The transport is two files: tcp.c (notices, transfers, collectives, teardown; the design is in
 * its opening comment) and tcp_setup.c (the mesh: listening, connecting, proving the token).
 */
#ifndef CDDP_COMM_TCP_H
#define CDDP_COMM_TCP_H

#include "comm/internal.h"

#include <poll.h>

#define TCP_MAGIC 0x43444450544350ull /* "CDDPTCP" */

enum { CH_DATA, CH_CONTROL };
/* What a peer's control connection said: nothing yet, or its one notice, or end-of-file. */
enum { PEER_LIVE, PEER_ABORTED, PEER_FAILED, PEER_LEFT, PEER_DIED };

typedef struct notice {
    uint64_t magic;
    int32_t kind; /* PEER_ABORTED, PEER_FAILED or PEER_LEFT */
    int32_t pad;
    char why[sizeof(((cddp_error *)0)->msg)];
} notice;

typedef cddp__xfer xfer;

typedef struct tcp {
    int *data, *control; /* per peer; -1 for this rank */
    int *pid;            /* each peer's process id, for the errors */
    int *state;          /* PEER_* per peer, from its control connection */
    notice *notes;       /* each peer's notice, as it arrives */
    size_t *noted;       /* bytes of it so far */
    struct pollfd *pfd;  /* 3 per rank: sends, receives, control connections */
    xfer *xfers;         /* 2 per rank: all_to_all's sends and receives */
    _Atomic int told;    /* this rank's notice: 0 not yet, 1 going out, 2 out */
    uint8_t *scratch;
    size_t scratch_size, small;
} tcp;

static inline tcp *T(const cddp_comm *c) {
    return c->priv;
}

/* tcp_setup.c: the transport's setup entry (builds the mesh). */
int cddp__tcp_setup(cddp_comm *c, struct cddp_store *st, double deadline, cddp_error *err);

#endif
