/* cddp-trace: says where every rank of a job stands, from the flight records its ranks wrote.
 *
 *   cddp-trace /tmp/cddp-flight-myjob                 the report
 *   cddp-trace --timeline trace.json LOGDIR/flight    and a Chrome trace of the records
 *
 * Each rank writes DIR/rank-R.json when its group fails or stalls, on SIGUSR1, or when cddprun
 * asks (cddprun --dump); see cddp/flight.h. The report names the ranks waiting in a collective
 * and the one they wait for, a rank in another step's phase, ranks that called different
 * collectives at one sequence number, and ranks that left no record.
 */
#include <cddp/cddp.h>
#include <cddp/flight.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: cddp-trace [--world N] [--timeline FILE] DIR\n"
            "Reads the flight records DIR/rank-R.json that a job's ranks wrote (when a group\n"
            "failed or stalled, on SIGUSR1, on `cddprun --dump`) and says where each rank\n"
            "stands and who is behind. DIR is CDDP_FLIGHT_DIR: cddprun's --logdir/flight, else\n"
            "$TMPDIR/cddp-flight-RUN (/tmp without TMPDIR; RUN: CDDP_RUN_ID or SLURM_JOB_ID);\n"
            "a log folder holding flight/ is also taken.\n\n"
            "  --world N        the job's ranks (ranks without a record are named); default: the\n"
            "                   records' own\n"
            "  --timeline FILE  also write the records' events as one Chrome trace (Perfetto,\n"
            "                   chrome://tracing): a row per rank, training and communication\n"
            "  -h, --help       this help\n\n"
            "Exit status: 0 when the report was written, 1 when DIR holds no record, 2 for a\n"
            "usage error.\n");
}

int main(int argc, char **argv) {
    static const struct option longs[] = {{"world", required_argument, NULL, 'w'},
                                          {"timeline", required_argument, NULL, 't'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    const char *timeline = NULL;
    int world = 0, c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'w':
            world = (int)strtol(optarg, &end, 10);
            if (!*optarg || *end || world < 1) {
                fprintf(stderr, "cddp-trace: --world %s: expected a count of ranks, >= 1\n",
                        optarg);
                return 2;
            }
            break;
        case 't':
            timeline = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "cddp-trace: expected one folder of flight records\n");
        usage(stderr);
        return 2;
    }
    const char *dir = argv[optind];
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/flight", dir);
    cddp_error err = {0};
    int rc = cddp_flight_report(dir, world, stdout, timeline, &err);
    if (rc == CDDP_ENOENT) { /* a cddprun --logdir: its flight/ */
        cddp_error e2 = {0};
        if (cddp_flight_report(sub, world, stdout, timeline, &e2) == CDDP_OK) rc = CDDP_OK;
    }
    if (rc != CDDP_OK) {
        fprintf(stderr, "cddp-trace: %s\n", cddp_error_msg(&err));
        return 1;
    }
    if (timeline) printf("timeline: %s (open it in https://ui.perfetto.dev)\n", timeline);
    return 0;
}
