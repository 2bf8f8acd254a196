/* test_dcomm.c: the choice "auto" makes (and DistributedDataParallel with it) from what every
 * rank's device and machine are, case by case, and the transports' names; and how many of a
 * host's ranks share a rank's CPUs, from their CPU sets. */
#include "helpers.h"
#include "comm/internal.h"
#include "dcomm/internal.h"

#include <cddp/flight.h>

enum { CPU = CDDP_DEVICE_CPU, EMU = CDDP_DEVICE_EMU, CUDA = CDDP_DEVICE_CUDA };

/* NCCL's place in the list: where its offer goes. */
static int nccl_at(void) {
    int n = 0;
    const cddp__dtransport *const *list = cddp__dcomm_list(&n);
    for (int i = 0; i < n; i++)
        if (list[i] == &cddp__nccl_dtransport) return i;
    fail_msg("nccl is not in the list");
    return -1;
}

/* A rank on a device of `kind` named `name`, card `card`, NCCL offering `nccl` there. */
static cddp__placement place(int kind, int64_t card, const char *name, int64_t nccl) {
    cddp__placement p = {.kind = kind, .card = card, .host = kind == CPU};
    snprintf(p.device, sizeof p.device, "%s", name);
    p.offer[nccl_at()] = nccl;
    return p;
}

/* decide(world, ranks) with why; asserts that why names `words`; the transport's name. */
static const char *decide(const cddp__placement *all, int world, const char *words) {
    char why[200] = "";
    const cddp__dtransport *t = cddp__dcomm_decide(all, world, why, sizeof why);
    if (!strstr(why, words)) fail_msg("why is '%s', without '%s'", why, words);
    return t->info.name;
}

static void test_auto_takes_nccl_for_a_gpu_per_rank(void **state) {
    (void)state;
    /* four GPUs, on one host or two: NCCL */
    cddp__placement four[4] = {place(CUDA, 11, "cuda:0", 22809), place(CUDA, 12, "cuda:1", 22809),
                               place(CUDA, 13, "cuda:0", 22809), place(CUDA, 14, "cuda:1", 22809)};
    assert_string_equal(decide(four, 4, "one rank per GPU, NCCL on every rank (2.28.9 on rank 0)"),
                        "nccl");
    /* two ranks on one GPU (ranks 1 and 3): NCCL would refuse them, so host copies */
    four[3].card = 12;
    assert_string_equal(decide(four, 4, "ranks 1 and 3 share a GPU, which NCCL refuses"), "host");
    /* NCCL missing on one rank */
    four[3].card = 14;
    four[2].offer[nccl_at()] = 0;
    assert_string_equal(decide(four, 4, "NCCL does not open on rank 2"), "host");
}

static void test_auto_takes_host_otherwise(void **state) {
    (void)state;
    cddp__placement one[1] = {place(CUDA, 11, "cuda:0", 22809)};
    assert_string_equal(decide(one, 1, "one rank: nothing travels"), "host");
    cddp__placement cpu[2] = {place(CPU, 1, "cpu", -1), place(CPU, 2, "cpu", -1)};
    assert_string_equal(decide(cpu, 2, "cpu: the group's transport works on the memory itself"),
                        "host");
    /* the emulated device: NCCL cannot read it, and CUDA IPC only when named */
    cddp__placement emu[2] = {place(EMU, 1, "emu:0", -1), place(EMU, 1, "emu:0", -1)};
    assert_string_equal(
        decide(emu, 2, "NCCL moves GPU memory only (cuda devices), not emu:0's (rank 0)"), "host");
    cddp__placement mixed[3] = {place(CUDA, 1, "cuda:0", 22809), place(CUDA, 2, "cuda:1", 22809),
                                place(CPU, 3, "cpu", -1)};
    assert_string_equal(decide(mixed, 3, "of different kinds (rank 0 cuda:0, rank 2 cpu)"), "host");
}

/* On one process, through a group of one (the real allgather): the CPU and emu:0. */
static void test_choose_on_this_machine(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(&(cddp_comm_options){.rank = 0, .world_size = 1}, &err);
    if (!g) fail_msg("%s", err.msg);
    const cddp_dcomm_transport_info *t = NULL;
    char why[200] = "";
    assert_int_equal(cddp_dcomm_choose(g, cddp_device_cpu(), &t, why, sizeof why, &err), CDDP_OK);
    assert_string_equal(t->name, "host");
    assert_string_equal(why, "one rank: nothing travels");
    cddp_dcomm *d = cddp_dcomm_create(g, cddp_device_cpu(), NULL, &err);
    assert_non_null(d);
    assert_string_equal(cddp_dcomm_transport_name(d), "host");
    cddp_dcomm_destroy(d);
    /* a transport that cannot serve: ipc on the CPU, saying why */
    assert_null(
        cddp_dcomm_create(g, cddp_device_cpu(), &(cddp_dcomm_options){.transport = "ipc"}, &err));
    assert_non_null(strstr(err.msg, "cpu shares no memory with other processes"));
    cddp_comm_destroy(g);
}

/* The names: "auto" and the list's, each found by its name at its index, and its traits. */
static void test_names(void **state) {
    (void)state;
    cddp_error err = {0};
    const char *names[] = {"auto", "nccl", "ipc", "host"};
    int n = 0;
    cddp__dcomm_list(&n);
    assert_int_equal(n, 3);
    for (int i = 0; i <= n; i++) {
        const cddp_dcomm_transport_info *t = cddp_dcomm_transport_find(names[i], &err);
        assert_non_null(t);
        assert_string_equal(t->name, names[i]);
        assert_int_equal(t->index, i);
        assert_ptr_equal(cddp_dcomm_transport_at(i), t);
        assert_int_equal(t->automatic, i == 0);
    }
    assert_null(cddp_dcomm_transport_at(n + 1));
    assert_ptr_equal(cddp_dcomm_transport_find(NULL, &err), cddp_dcomm_transport_at(0));
    assert_true(cddp_dcomm_transport_find("nccl", &err)->on_device);
    assert_true(cddp_dcomm_transport_find("ipc", &err)->f32_sums);
    assert_false(cddp_dcomm_transport_find("host", &err)->on_device);
    assert_null(cddp_dcomm_transport_find("gloo", &err));
    assert_int_equal(err.code, CDDP_EINVAL);
    assert_non_null(strstr(err.msg, "'gloo' is not a transport: expected auto, nccl, ipc or host"));
    assert_string_equal(cddp_device_bus_id(cddp_device_cpu()), "cpu");
}

/* A transport of the test's own, for what cddp_dcomm does around every transport: its
 * collectives succeed at once, the watchdog knows `known` of them done, a watch fails when
 * `watch_fails` is set. */
static uint64_t known;
static int watch_fails;
static int fake_collective(void *c, const void *send, void *recv, int64_t count,
                           cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    (void)c, (void)send, (void)recv, (void)count, (void)dtype, (void)op, (void)err;
    return CDDP_OK;
}
static int fake_allgather(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_error *err) {
    return fake_collective(c, send, recv, count, dtype, CDDP_COMM_SUM, err);
}
static int fake_ok(void *c, cddp_error *err) {
    (void)c, (void)err;
    return CDDP_OK;
}
static int fake_watch(void *c, cddp_error *err) {
    (void)c;
    return watch_fails ? cddp_error_set(err, CDDP_EIO, "the fake's peer died") : CDDP_OK;
}
static uint64_t fake_known_done(void *c) {
    (void)c;
    return known;
}
static void *fake_open(cddp_comm *group, cddp_device *dev, const cddp_dcomm_options *o,
                       cddp_error *err) {
    (void)group, (void)dev, (void)o, (void)err;
    return &known;
}
static void fake_destroy(void *c) {
    (void)c;
}
static const cddp__dtransport fake = {
    .info = {.name = "fake", .says = "fake", .how = "at once", .on_device = true},
    .open = fake_open,
    .allreduce = fake_collective,
    .reduce_scatter = fake_collective,
    .allgather = fake_allgather,
    .join = fake_ok,
    .wait = fake_ok,
    .watch = fake_watch,
    .known_done = fake_known_done,
    .destroy = fake_destroy,
};

/* Collective #seq of the fake's flight group is in the record in state `state`. */
static void recorded(const char *text, int seq, const char *state) {
    char want[200];
    snprintf(want, sizeof want,
             "\"seq\": %d, \"op\": \"allreduce\", \"reduce\": \"sum\", "
             "\"dtype\": \"float32\", \"count\": 4, \"bytes\": 16, \"device\": \"cpu\", "
             "\"transport\": \"fake\", \"state\": \"%s\"",
             seq, state);
    if (!strstr(text, want)) fail_msg("no '%s' in the record", want);
}

/* The record as it is now. */
static char *dumped(void) {
    char path[512];
    size_t n = 0;
    cddp_error err = {0};
    assert_int_equal(cddp_flight_dump("a test", path, sizeof path, &err), CDDP_OK);
    return (char *)slurp(path, &n);
}

/* The flight recorder sees a transport's collectives as it learns of them: started when issued,
 * done as its watchdog counts them done (in order), failed when a watch reports the failure; past
 * 256 not known done, the oldest stay started. */
static void test_flight_record_of_a_transport(void **state) {
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/flight", test_dir);
    setenv("CDDP_FLIGHT_DIR", dir, 1);
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(&(cddp_comm_options){.rank = 0, .world_size = 1}, &err);
    if (!g) fail_msg("%s", err.msg);
    cddp_dcomm *d = cddp__dcomm_open(&fake, g, cddp_device_cpu(), &(cddp_dcomm_options){0}, &err);
    assert_non_null(d);
    float x[4] = {0};
    for (int i = 0; i < 3; i++)
        assert_int_equal(cddp_dcomm_allreduce(d, x, x, 4, CDDP_COMM_F32, CDDP_COMM_SUM, &err),
                         CDDP_OK);
    assert_int_equal(cddp_dcomm_watch(d, &err), CDDP_OK);
    char *t = dumped();
    for (int s = 1; s <= 3; s++) recorded(t, s, "started");
    free(t);
    known = 2; /* the watchdog saw the first two run */
    assert_int_equal(cddp_dcomm_watch(d, &err), CDDP_OK);
    t = dumped();
    recorded(t, 1, "done"), recorded(t, 2, "done"), recorded(t, 3, "started");
    free(t);
    watch_fails = 1;
    assert_int_equal(cddp_dcomm_watch(d, &err), CDDP_EIO);
    t = dumped();
    recorded(t, 2, "done"), recorded(t, 3, "failed");
    free(t);
    watch_fails = 0;
    for (int i = 0; i < 300; i++) /* #4 .. #303, none known done */
        assert_int_equal(cddp_dcomm_allreduce(d, x, x, 4, CDDP_COMM_F32, CDDP_COMM_SUM, &err),
                         CDDP_OK);
    known = 303;
    assert_int_equal(cddp_dcomm_join(d, &err), CDDP_OK);
    t = dumped();
    recorded(t, 4, "started"), recorded(t, 47, "started"); /* let go of: 300 - 256 */
    recorded(t, 48, "done"), recorded(t, 303, "done");
    free(t);
    cddp_dcomm_destroy(d);
    cddp_comm_destroy(g);
    unsetenv("CDDP_FLIGHT_DIR");
}

/* sets[r] = CPUs lo..hi-1 of a 64-CPU host (hi 0: not known) */
static void cpus(cpu_set_t *s, int lo, int hi) {
    CPU_ZERO(s);
    for (int c = lo; c < hi; c++) CPU_SET(c, s);
}

static void test_cpu_sharers_case_by_case(void **state) {
    (void)state;
    cpu_set_t s[4];
    /* bound to 16 CPUs each (cddprun --bind_core, srun --cpus-per-task=16): each alone */
    for (int r = 0; r < 4; r++) cpus(&s[r], 16 * r, 16 * r + 16);
    for (int r = 0; r < 4; r++) assert_int_equal(cddp__cpu_sharers(s, 4, r), 1);
    /* unbound: every rank on all 64 */
    for (int r = 0; r < 4; r++) cpus(&s[r], 0, 64);
    for (int r = 0; r < 4; r++) assert_int_equal(cddp__cpu_sharers(s, 4, r), 4);
    /* two sockets, two ranks bound to each (mpirun's --bind-to socket) */
    cpus(&s[0], 0, 32), cpus(&s[1], 32, 64), cpus(&s[2], 0, 32), cpus(&s[3], 32, 64);
    for (int r = 0; r < 4; r++) assert_int_equal(cddp__cpu_sharers(s, 4, r), 2);
    /* overlapping by one CPU: 0 meets 1, 1 meets 0 and 2, 3 alone */
    cpus(&s[0], 0, 9), cpus(&s[1], 8, 17), cpus(&s[2], 16, 24), cpus(&s[3], 24, 32);
    assert_int_equal(cddp__cpu_sharers(s, 4, 0), 2);
    assert_int_equal(cddp__cpu_sharers(s, 4, 1), 3);
    assert_int_equal(cddp__cpu_sharers(s, 4, 3), 1);
    /* a set not known (empty) meets every set, and its own count is 0 */
    cpus(&s[2], 0, 0);
    assert_int_equal(cddp__cpu_sharers(s, 4, 3), 2);
    assert_int_equal(cddp__cpu_sharers(s, 4, 2), 0);
}

/* A group of one: the cores this process may run on, all its own. */
static void test_local_cores_of_a_group_of_one(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(&(cddp_comm_options){.rank = 0, .world_size = 1}, &err);
    if (!g) fail_msg("%s", err.msg);
    assert_int_equal(cddp_comm_local_cores(g), cddp_num_cores());
    cddp_comm_destroy(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_takes_nccl_for_a_gpu_per_rank),
        cmocka_unit_test(test_auto_takes_host_otherwise),
        cmocka_unit_test(test_choose_on_this_machine),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_flight_record_of_a_transport),
        cmocka_unit_test(test_cpu_sharers_case_by_case),
        cmocka_unit_test(test_local_cores_of_a_group_of_one),
    };
    return cmocka_run_group_tests(tests, temp_dir_setup, temp_dir_teardown);
}
