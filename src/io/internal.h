/* io/internal.h: atomic file replacement, shared by every writer of files users keep.
 *
 * cddp__atomic_open creates PATH.tmp.HOST.PID next to PATH (first removing such temporaries of
 * this host whose writer no longer runs: a save killed midway); writes go there; cddp__atomic_close
 * with a success status flushes the data to disk, renames the temporary over PATH and syncs the
 * folder, and with a failure status removes the temporary. Readers of PATH see the old file or
 * the complete new one, never a part.
 */
#ifndef CDDP_IO_INTERNAL_H
#define CDDP_IO_INTERNAL_H

#include "cddp/core.h"

#include <stdio.h>

typedef struct cddp__atomic_file {
    FILE *f;
    const char *path;
    char tmp[4096];
} cddp__atomic_file;

int cddp__atomic_open(cddp__atomic_file *af, const char *path, cddp_error *err);
int cddp__atomic_write(cddp__atomic_file *af, const void *data, size_t bytes, cddp_error *err);
/* Commits when rc is CDDP_OK, discards otherwise; returns the final status. */
int cddp__atomic_close(cddp__atomic_file *af, int rc, cddp_error *err);

#endif
