/* What rxe has beyond the verbs every device has, through libibverbs' own
 * header: memory windows (ibv_alloc_mw, ibv_bind_mw and ibv_dealloc_mw are
 * inline functions of <infiniband/verbs.h> that call the device context's
 * ops) and IBTA 1.5's ATOMIC WRITE (ibv_wr_atomic_write, inline too, and
 * IBV_WR_ATOMIC_WRITE), so this program checks softrnic's ABI for them as
 * any program compiled against rdma-core sees it.
 *
 * One process, two RC QPs of one device connected to each other: QP b binds
 * windows over a region that grants no remote access itself, QP a writes
 * through them, and a SEND with invalidate from a shuts a type 2 window;
 * then a stores 8-byte words with ATOMIC WRITE both ways.
 * Prints "rxe-parity: N checks passed" and exits 0, or names the failed
 * check and exits 1. Built and run by scripts/verbs-matrix.py.
 *
 *     cc -O2 -o rxe-parity rxe-parity.c -libverbs
 */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int checks;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "rxe-parity: line %d: ", __LINE__);                 \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            exit(1);                                                          \
        }                                                                     \
        checks++;                                                             \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The next completion of `cq`, within 10 s. */
static struct ibv_wc poll_one(struct ibv_cq *cq)
{
    struct ibv_wc wc;
    double deadline = now() + 10;
    int n;
    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
        if (now() > deadline) {
            fprintf(stderr, "rxe-parity: no completion within 10 s\n");
            exit(1);
        }
    }
    CHECK(n == 1, "ibv_poll_cq returned %d", n);
    return wc;
}

/* RESET -> INIT -> RTR -> RTS towards QP `remote` of the same device. */
static void connect_qp(struct ibv_qp *qp, uint32_t remote, union ibv_gid *gid)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .port_num = 1,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
    };
    CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0, "INIT");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = remote;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = *gid;
    a.ah_attr.grh.hop_limit = 1;
    CHECK(ibv_modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
          "RTR");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    CHECK(ibv_modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                            IBV_QP_MAX_QP_RD_ATOMIC) == 0,
          "RTS");
}

static struct ibv_qp *a, *b;
static struct ibv_cq *cq_a, *cq_b;
static struct ibv_mr *src_mr;
static char src[4096], dst[4096];

/* a writes `text` at dst + offset under `rkey`; returns the status. */
static enum ibv_wc_status write_through(uint64_t wr_id, uint32_t rkey, size_t offset, const char *text)
{
    struct ibv_sge sge = {.addr = (uintptr_t)src, .length = strlen(text), .lkey = src_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED}, *bad;
    memcpy(src, text, strlen(text));
    wr.wr.rdma.remote_addr = (uintptr_t)dst + offset;
    wr.wr.rdma.rkey = rkey;
    CHECK(ibv_post_send(a, &wr, &bad) == 0, "post the WRITE");
    struct ibv_wc wc = poll_one(cq_a);
    CHECK(wc.wr_id == wr_id, "the WRITE's completion");
    return wc.status;
}

int main(void)
{
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n > 0, "no RDMA device");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "ibv_open_device");
    struct ibv_device_attr attr;
    CHECK(ibv_query_device(ctx, &attr) == 0, "ibv_query_device");
    CHECK(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW, "the device says it has memory windows");
    CHECK(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B, "and type 2B ones");
    union ibv_gid gid;
    CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    cq_a = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    cq_b = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    /* a posts through ibv_qp_ex's builder too. */
    struct ibv_qp_init_attr_ex init_ex = {
        .qp_type = IBV_QPT_RC,
        .send_cq = cq_a,
        .recv_cq = cq_a,
        .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1},
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = pd,
        .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_ATOMIC_WRITE,
    };
    a = ibv_create_qp_ex(ctx, &init_ex);
    struct ibv_qp_init_attr init = {.qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
    init.send_cq = init.recv_cq = cq_b;
    b = ibv_create_qp(pd, &init);
    CHECK(pd && cq_a && cq_b && a && b, "PD, CQs and QPs");
    connect_qp(a, b->qp_num, &gid);
    connect_qp(b, a->qp_num, &gid);
    src_mr = ibv_reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *dst_mr = ibv_reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    CHECK(src_mr && dst_mr, "ibv_reg_mr with IBV_ACCESS_MW_BIND");
    struct ibv_wc wc;

    /* Type 1: ibv_bind_mw posts the bind on b and moves mw->rkey on. */
    struct ibv_mw *one = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
    CHECK(one && one->type == IBV_MW_TYPE_1 && one->pd == pd, "ibv_alloc_mw type 1");
    uint32_t before = one->rkey;
    struct ibv_mw_bind bind = {.wr_id = 1, .send_flags = IBV_SEND_SIGNALED,
                               .bind_info = {.mr = dst_mr, .addr = (uintptr_t)dst, .length = 1024,
                                             .mw_access_flags = IBV_ACCESS_REMOTE_WRITE}};
    CHECK(ibv_bind_mw(b, one, &bind) == 0, "ibv_bind_mw");
    wc = poll_one(cq_b);
    CHECK(wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, "the bind completes: %s",
          ibv_wc_status_str(wc.status));
    CHECK(one->rkey == ibv_inc_rkey(before), "the window's rkey moved on");
    CHECK(write_through(2, one->rkey, 16, "type one") == IBV_WC_SUCCESS, "a WRITE through the type 1 window");
    CHECK(memcmp(dst + 16, "type one", 8) == 0, "the bytes landed");
    CHECK(ibv_dereg_mr(dst_mr) != 0, "a bound window holds its region");
    CHECK(ibv_dealloc_mw(one) == 0, "ibv_dealloc_mw");

    /* Type 2: bound by a work request, under the key the program picks. */
    struct ibv_mw *two = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    CHECK(two, "ibv_alloc_mw type 2");
    uint32_t rkey = ibv_inc_rkey(two->rkey);
    struct ibv_send_wr wr = {.wr_id = 3, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED}, *bad;
    wr.bind_mw.mw = two;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info = (struct ibv_mw_bind_info){.mr = dst_mr, .addr = (uintptr_t)dst + 2048, .length = 512,
                                                     .mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
    CHECK(ibv_post_send(b, &wr, &bad) == 0, "post IBV_WR_BIND_MW");
    wc = poll_one(cq_b);
    CHECK(wc.wr_id == 3 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, "the type 2 bind completes");
    CHECK(write_through(4, rkey, 2048 + 100, "type two") == IBV_WC_SUCCESS, "a WRITE through the type 2 window");
    CHECK(memcmp(dst + 2148, "type two", 8) == 0, "the bytes landed");

    /* SEND with invalidate: b's receive names the key it shut. */
    struct ibv_sge recv_sge = {.addr = (uintptr_t)dst, .length = 64, .lkey = dst_mr->lkey};
    struct ibv_recv_wr recv = {.wr_id = 5, .sg_list = &recv_sge, .num_sge = 1}, *bad_recv;
    CHECK(ibv_post_recv(b, &recv, &bad_recv) == 0, "post the receive");
    struct ibv_sge sge = {.addr = (uintptr_t)src, .length = 4, .lkey = src_mr->lkey};
    struct ibv_send_wr send = {.wr_id = 6, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
                               .send_flags = IBV_SEND_SIGNALED};
    send.invalidate_rkey = rkey;
    CHECK(ibv_post_send(a, &send, &bad) == 0, "post IBV_WR_SEND_WITH_INV");
    wc = poll_one(cq_a);
    CHECK(wc.wr_id == 6 && wc.status == IBV_WC_SUCCESS, "the SEND with invalidate completes");
    wc = poll_one(cq_b);
    CHECK(wc.wr_id == 5 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV, "its receive completes");
    CHECK((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == rkey, "naming the key it invalidated");

    /* Bound again under the next key, then invalidated locally. */
    uint32_t again = ibv_inc_rkey(rkey);
    wr.wr_id = 7;
    wr.bind_mw.rkey = again;
    struct ibv_send_wr inv = {.wr_id = 8, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED};
    inv.invalidate_rkey = again;
    wr.next = &inv;
    CHECK(ibv_post_send(b, &wr, &bad) == 0, "post a bind and a local invalidate");
    wc = poll_one(cq_b);
    CHECK(wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS, "the rebind completes");
    wc = poll_one(cq_b);
    CHECK(wc.wr_id == 8 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV, "the local invalidate");
    CHECK(ibv_dealloc_mw(two) == 0, "ibv_dealloc_mw type 2");

    /* ATOMIC WRITE: the device says so in device_cap_flags_ex (bit 40, the
     * kernel's IB_UVERBS_DEVICE_ATOMIC_WRITE, which rdma-core 44 does not
     * name), and stores 8 bytes whole, by the builder and by ibv_post_send. */
    struct ibv_device_attr_ex attr_ex;
    CHECK(ibv_query_device_ex(ctx, NULL, &attr_ex) == 0, "ibv_query_device_ex");
    CHECK(attr_ex.device_cap_flags_ex & (1ULL << 40), "the device says it has ATOMIC WRITE");
    struct ibv_mr *word_mr = ibv_reg_mr(pd, dst + 3072, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(word_mr, "a region for the words");
    struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(a);
    CHECK(qx, "ibv_qp_to_qp_ex");
    uint64_t value;
    memcpy(&value, "8 bytes!", 8);
    ibv_wr_start(qx);
    qx->wr_id = 10;
    qx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(qx, word_mr->rkey, (uintptr_t)dst + 3072, &value);
    CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_complete");
    wc = poll_one(cq_a);
    CHECK(wc.wr_id == 10 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE,
          "ibv_wr_atomic_write completes: %s", ibv_wc_status_str(wc.status));
    CHECK(memcmp(dst + 3072, "8 bytes!", 8) == 0, "the word landed");
    memcpy(src, "by post!", 8);
    struct ibv_sge word_sge = {.addr = (uintptr_t)src, .length = 8, .lkey = src_mr->lkey};
    struct ibv_send_wr atomic = {.wr_id = 11, .sg_list = &word_sge, .num_sge = 1, .opcode = IBV_WR_ATOMIC_WRITE,
                                 .send_flags = IBV_SEND_SIGNALED};
    atomic.wr.rdma.remote_addr = (uintptr_t)dst + 3080;
    atomic.wr.rdma.rkey = word_mr->rkey;
    CHECK(ibv_post_send(a, &atomic, &bad) == 0, "post IBV_WR_ATOMIC_WRITE");
    wc = poll_one(cq_a);
    CHECK(wc.wr_id == 11 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE, "it completes");
    CHECK(memcmp(dst + 3080, "by post!", 8) == 0, "the word landed");
    CHECK(ibv_dereg_mr(word_mr) == 0, "the words' region goes");

    /* An invalidated key reaches nothing (and fails a's QP, so last). */
    CHECK(write_through(9, rkey, 2048, "late") == IBV_WC_REM_ACCESS_ERR, "the old key is refused");

    ibv_destroy_qp(a);
    ibv_destroy_qp(b);
    CHECK(ibv_dereg_mr(dst_mr) == 0 && ibv_dereg_mr(src_mr) == 0, "the regions go once the windows have");
    ibv_destroy_cq(cq_a);
    ibv_destroy_cq(cq_b);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    printf("rxe-parity: %d checks passed\n", checks);
    return 0;
}
