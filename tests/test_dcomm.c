/* test_dcomm.c: the choice CDDP_DCOMM_AUTO makes (and DistributedDataParallel with it) from what
 * every rank's device and machine are, case by case, and the transports' spellings; and how many
 * of a host's ranks share a rank's CPUs, from their CPU sets. */
#include "helpers.h"
#include "comm/internal.h"
#include "ddp/internal.h"

enum { CPU = CDDP_DEVICE_CPU, EMU = CDDP_DEVICE_EMU, CUDA = CDDP_DEVICE_CUDA };

/* decide(world, ranks) with why; asserts that why names `words`. */
static cddp_dcomm_transport decide(const cddp__placement *all, int world, const char *words) {
    char why[200] = "";
    cddp_dcomm_transport t = cddp__dcomm_decide(all, world, why, sizeof why);
    if (!strstr(why, words)) fail_msg("why is '%s', without '%s'", why, words);
    return t;
}

static void test_auto_takes_nccl_for_a_gpu_per_rank(void **state) {
    (void)state;
    /* four GPUs, on one host or two: NCCL */
    cddp__placement four[4] = {
        {CUDA, 11, 22809}, {CUDA, 12, 22809}, {CUDA, 13, 22809}, {CUDA, 14, 22809}};
    assert_int_equal(decide(four, 4, "one rank per GPU, NCCL on every rank (2.28.9 on rank 0)"),
                     CDDP_DCOMM_NCCL);
    /* two ranks on one GPU (ranks 1 and 3): NCCL would refuse them, so host copies */
    four[3].card = 12;
    assert_int_equal(decide(four, 4, "ranks 1 and 3 share a GPU, which NCCL refuses"),
                     CDDP_DCOMM_HOST);
    /* NCCL missing on one rank */
    four[3].card = 14;
    four[2].nccl = 0;
    assert_int_equal(decide(four, 4, "NCCL does not open on rank 2"), CDDP_DCOMM_HOST);
}

static void test_auto_takes_host_otherwise(void **state) {
    (void)state;
    cddp__placement one[1] = {{CUDA, 11, 22809}};
    assert_int_equal(decide(one, 1, "one rank: nothing travels"), CDDP_DCOMM_HOST);
    cddp__placement cpu[2] = {{CPU, 1, 0}, {CPU, 2, 0}};
    assert_int_equal(decide(cpu, 2, "the CPU"), CDDP_DCOMM_HOST);
    /* the emulated device: NCCL cannot read it, and CUDA IPC only when named */
    cddp__placement emu[2] = {{EMU, 1, 0}, {EMU, 1, 0}};
    assert_int_equal(decide(emu, 2, "NCCL moves GPU memory only"), CDDP_DCOMM_HOST);
    cddp__placement mixed[3] = {{CUDA, 1, 22809}, {CUDA, 2, 22809}, {CPU, 3, 0}};
    assert_int_equal(decide(mixed, 3, "of different kinds (rank 0 cuda, rank 2 cpu)"),
                     CDDP_DCOMM_HOST);
}

/* On one process, through a group of one (the real allgather): the CPU and emu:0. */
static void test_choose_on_this_machine(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(&(cddp_comm_options){.rank = 0, .world_size = 1}, &err);
    if (!g) fail_msg("%s", err.msg);
    cddp_dcomm_transport t = CDDP_DCOMM_NCCL;
    char why[200] = "";
    assert_int_equal(cddp_dcomm_choose(g, cddp_device_cpu(), &t, why, sizeof why, &err), CDDP_OK);
    assert_int_equal(t, CDDP_DCOMM_HOST);
    assert_string_equal(why, "one rank: nothing travels");
    cddp_dcomm_destroy(cddp_dcomm_create(g, cddp_device_cpu(), NULL, &err));
    assert_int_equal(err.code, CDDP_OK);
    cddp_comm_destroy(g);
}

static void test_spellings(void **state) {
    (void)state;
    cddp_error err = {0};
    const char *names[] = {"auto", "host", "ipc", "nccl"};
    for (int i = 0; i < 4; i++) {
        cddp_dcomm_transport t = (cddp_dcomm_transport)-1;
        assert_int_equal(cddp_dcomm_transport_parse(names[i], &t, &err), CDDP_OK);
        assert_int_equal(t, i);
        assert_string_equal(cddp_dcomm_transport_spelling(t), names[i]);
    }
    assert_int_equal(cddp_dcomm_transport_parse("gloo", &(cddp_dcomm_transport){0}, &err),
                     CDDP_EINVAL);
    assert_non_null(strstr(err.msg, "'gloo' is not a transport: expected auto, host, ipc or nccl"));
    assert_string_equal(cddp_dcomm_transport_spelling((cddp_dcomm_transport)9), "unknown");
    assert_string_equal(cddp_device_bus_id(cddp_device_cpu()), "cpu");
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
        cmocka_unit_test(test_spellings),
        cmocka_unit_test(test_cpu_sharers_case_by_case),
        cmocka_unit_test(test_local_cores_of_a_group_of_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
