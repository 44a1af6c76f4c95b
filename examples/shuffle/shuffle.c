/* A shuffle-heavy job: GroupBy or SortBy over N key-value pairs of 2 KB,
 * M mappers and R reducers, each its own process, the shuffle over RDMA
 * (rdma_cm connections, one-sided writes) or over TCP.
 *
 *   cc -O2 -o shuffle shuffle.c -lrdmacm -libverbs -lpthread
 *   shuffle reducer -i R -l ADDR:PORT -m MAPPERS -n REDUCERS -p PAIRS -o groupby|sortby -t rdma|tcp
 *   shuffle mapper  -i M -r ADDR:PORT,ADDR:PORT,... -m MAPPERS -p PAIRS -o groupby|sortby -t rdma|tcp
 *
 * Mapper m generates pairs [m N / M, (m + 1) N / M) (each pair's key and
 * value follow from its index and the job, so a reducer can check what it
 * got), partitions them by reducer into one buffer (hash of the key for
 * GroupBy, key ranges for SortBy) and ships each reducer its part.
 *
 * The RDMA design: the mapper says in its connect request's private data
 * how many bytes it has for the reducer; the reducer allocates and
 * registers exactly that and answers with the address and key in its
 * accept; the mapper WRITEs the part in 1 MiB pieces, the last one
 * WRITE_WITH_IMM (the immediate: the mapper's number), whose receive
 * completion tells the reducer the whole part is in place (RC delivers in
 * order). So pairs land once, where the reduce reads them: no receive
 * buffers to size and post, no copy out of them, no receiver-not-ready,
 * and the reducer's CPU does nothing while its input arrives. SENDs would
 * need a receive per 2 KB pair (or reassembly of larger ones) and a copy
 * into the reduce's input. Over TCP the same header, then the part,
 * received straight into the same kind of buffer.
 *
 * Each process prints its timestamps (CLOCK_REALTIME, microseconds; the
 * processes share the machine's clock): the job runs from the first
 * mapper's start to the last reducer's end, the shuffle from the first
 * byte shipped to the last part in place. A reducer then checks its
 * output (every pair it should have, once, intact; every group complete;
 * the sort ordered) and exits 1 if anything is wrong. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PAIR_BYTES 2048
#define VALUE_WORDS ((PAIR_BYTES - 16) / 8)
#define PIECE (1 << 20)   /* bytes a WRITE carries */
#define DEPTH 16          /* WRITEs in flight per connection */
#define MAX_PEERS 64
#define PAIRS_PER_GROUP 64 /* GroupBy's keys: N / 64 groups */

typedef struct {
    uint64_t key, index;
    uint64_t value[VALUE_WORDS];
} pair_t;

/* What a mapper tells a reducer first (rdma_cm private data, or the TCP
 * stream's first bytes), and what the reducer answers over RDMA. */
typedef struct {
    uint32_t mapper;
    uint32_t pad;
    uint64_t bytes;
} part_header_t;

typedef struct {
    uint64_t addr;
    uint32_t rkey;
    uint32_t pad;
} part_place_t;

static struct {
    int mapper; /* 1: mapper, 0: reducer */
    int id, mappers, reducers, rdma, sortby;
    uint64_t pairs;
    char *listen; /* reducer: ADDR:PORT */
    char *peers[MAX_PEERS];
} job;

static void die(const char *fmt, const char *what) {
    fprintf(stderr, "shuffle %s %d: ", job.mapper ? "mapper" : "reducer", job.id);
    fprintf(stderr, fmt, what);
    fprintf(stderr, "%s%s\n", errno ? ": " : "", errno ? strerror(errno) : "");
    exit(2);
}

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- the job's data: everything follows from a pair's index ---- */

static uint64_t groups(void) { return job.pairs / PAIRS_PER_GROUP ? job.pairs / PAIRS_PER_GROUP : 1; }

static uint64_t key_of(uint64_t index) {
    uint64_t h = mix(index + 0x9E3779B97F4A7C15ull);
    return job.sortby ? h : h % groups();
}

static int reducer_of(uint64_t key) {
    if (job.sortby) return (int)(((unsigned __int128)key * (unsigned)job.reducers) >> 64);
    return (int)(mix(key ^ 0xD1B54A32D192ED03ull) % (unsigned)job.reducers);
}

static uint64_t value_word(uint64_t index, int j) { return index * 0x9E3779B97F4A7C15ull + (uint64_t)j; }

static void make_pair(pair_t *p, uint64_t index) {
    p->key = key_of(index), p->index = index;
    for (int j = 0; j < VALUE_WORDS; j++) p->value[j] = value_word(index, j);
}

static int pair_intact(const pair_t *p) {
    if (p->index >= job.pairs || p->key != key_of(p->index) || reducer_of(p->key) != job.id) return 0;
    for (int j = 0; j < VALUE_WORDS; j++)
        if (p->value[j] != value_word(p->index, j)) return 0;
    return 1;
}

static void *alloc_pages(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 4096)) die("cannot allocate %s bytes", "the job's");
    return p;
}

static void split_addr(const char *text, struct sockaddr_in *out) {
    char host[64];
    const char *colon = strrchr(text, ':');
    if (!colon || colon - text >= (long)sizeof host) die("`%s` is no ADDR:PORT", text);
    memcpy(host, text, colon - text), host[colon - text] = 0;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET, out->sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &out->sin_addr) != 1) die("`%s` is no IPv4 address", host);
}

/* ---- RDMA: the connection manager's events, waited for ---- */

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type) {
    struct rdma_cm_event *event;
    if (rdma_get_cm_event(ch, &event)) die("%s", "rdma_get_cm_event");
    if (event->event != type) {
        errno = 0;
        fprintf(stderr, "shuffle: expected %s, got %s (status %d)\n", rdma_event_str(type), rdma_event_str(event->event),
                event->status);
        exit(2);
    }
    return event;
}

/* Waits on a CQ's completion channel (no spinning: sixteen processes
 * share this machine's cores) and takes up to n completions. */
static int wait_completions(struct ibv_comp_channel *channel, struct ibv_cq *cq, struct ibv_wc *wc, int n) {
    for (;;) {
        int got = ibv_poll_cq(cq, n, wc);
        if (got) return got;
        struct ibv_cq *ev_cq;
        void *ctx;
        if (ibv_req_notify_cq(cq, 0)) die("%s", "ibv_req_notify_cq");
        got = ibv_poll_cq(cq, n, wc); /* one may have come before the request */
        if (got) return got;
        if (ibv_get_cq_event(channel, &ev_cq, &ctx)) die("%s", "ibv_get_cq_event");
        ibv_ack_cq_events(ev_cq, 1);
    }
}

static void check_wc(const struct ibv_wc *wc) {
    if (wc->status != IBV_WC_SUCCESS) {
        errno = 0;
        die("a work request failed: %s", ibv_wc_status_str(wc->status));
    }
}

/* ---- mapper ---- */

typedef struct {
    char *data;
    uint64_t bytes;
} part_t;

static void ship_rdma(part_t *parts) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    if (!ch) die("%s", "rdma_create_event_channel");
    struct rdma_cm_id *ids[MAX_PEERS];
    part_place_t places[MAX_PEERS];
    struct ibv_pd *pd = NULL;
    struct ibv_mr *mr = NULL;
    struct ibv_comp_channel *channel = NULL;
    struct ibv_cq *cq = NULL;
    char *base = parts[0].data;
    uint64_t total = 0;
    for (int r = 0; r < job.reducers; r++) total += parts[r].bytes;
    for (int r = 0; r < job.reducers; r++) {
        struct sockaddr_in dst;
        split_addr(job.peers[r], &dst);
        if (rdma_create_id(ch, &ids[r], NULL, RDMA_PS_TCP)) die("%s", "rdma_create_id");
        if (rdma_resolve_addr(ids[r], NULL, (struct sockaddr *)&dst, 2000)) die("rdma_resolve_addr %s", job.peers[r]);
        rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
        if (rdma_resolve_route(ids[r], 2000)) die("%s", "rdma_resolve_route");
        rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
        if (!pd) {
            pd = ibv_alloc_pd(ids[r]->verbs);
            channel = ibv_create_comp_channel(ids[r]->verbs);
            cq = channel ? ibv_create_cq(ids[r]->verbs, job.reducers * DEPTH, NULL, channel, 0) : NULL;
            mr = pd ? ibv_reg_mr(pd, base, total ? total : 1, IBV_ACCESS_LOCAL_WRITE) : NULL;
            if (!cq || !mr) die("%s", "cannot set up the device (PD, CQ, MR)");
        }
        struct ibv_qp_init_attr attr = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                        .cap = {.max_send_wr = DEPTH, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
        if (rdma_create_qp(ids[r], pd, &attr)) die("%s", "rdma_create_qp");
        part_header_t header = {.mapper = (uint32_t)job.id, .bytes = parts[r].bytes};
        struct rdma_conn_param param = {.private_data = &header, .private_data_len = sizeof header,
                                        .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7};
        if (rdma_connect(ids[r], &param)) die("%s", "rdma_connect");
        struct rdma_cm_event *event = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
        if (event->param.conn.private_data_len < sizeof(part_place_t)) die("reducer %s sent no address", job.peers[r]);
        memcpy(&places[r], event->param.conn.private_data, sizeof(part_place_t));
        rdma_ack_cm_event(event);
    }
    printf("shuffle_start_us %llu\n", (unsigned long long)now_us());
    /* Every part in 1 MiB WRITEs, up to DEPTH in flight on each
     * connection, the last one carrying the immediate. */
    uint64_t sent[MAX_PEERS] = {0};
    int inflight[MAX_PEERS] = {0}, finished = 0, done[MAX_PEERS] = {0};
    while (finished < job.reducers) {
        for (int r = 0; r < job.reducers; r++) {
            while (!done[r] && inflight[r] < DEPTH && (sent[r] < parts[r].bytes || (parts[r].bytes == 0 && sent[r] == 0 && inflight[r] == 0))) {
                uint64_t len = parts[r].bytes - sent[r] < PIECE ? parts[r].bytes - sent[r] : PIECE;
                int last = sent[r] + len == parts[r].bytes;
                struct ibv_sge sge = {.addr = (uintptr_t)(parts[r].data + sent[r]), .length = (uint32_t)len, .lkey = mr->lkey};
                struct ibv_send_wr wr = {.wr_id = (uint64_t)r, .sg_list = &sge, .num_sge = len ? 1 : 0,
                                         .opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                                         .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl((uint32_t)job.id),
                                         .wr.rdma = {.remote_addr = places[r].addr + sent[r], .rkey = places[r].rkey}};
                struct ibv_send_wr *bad;
                if (ibv_post_send(ids[r]->qp, &wr, &bad)) die("%s", "ibv_post_send");
                sent[r] += len, inflight[r]++;
                if (last) done[r] = 1;
            }
        }
        struct ibv_wc wc[32];
        int n = wait_completions(channel, cq, wc, 32);
        for (int i = 0; i < n; i++) {
            check_wc(&wc[i]);
            int r = (int)wc[i].wr_id;
            if (--inflight[r] == 0 && done[r]) finished++;
        }
    }
    for (int r = 0; r < job.reducers; r++) {
        rdma_disconnect(ids[r]);
        rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
        rdma_destroy_qp(ids[r]);
        rdma_destroy_id(ids[r]);
    }
    ibv_dereg_mr(mr), ibv_destroy_cq(cq), ibv_destroy_comp_channel(channel), ibv_dealloc_pd(pd);
    rdma_destroy_event_channel(ch);
}

static int connect_tcp(const char *peer) {
    struct sockaddr_in dst;
    split_addr(peer, &dst);
    for (int attempt = 0;; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) die("%s", "socket");
        if (connect(fd, (struct sockaddr *)&dst, sizeof dst) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return fd;
        }
        close(fd);
        if (attempt == 200) die("cannot connect to %s", peer);
        usleep(50000);
    }
}

static void write_all(int fd, const void *data, uint64_t bytes) {
    for (uint64_t off = 0; off < bytes;) {
        ssize_t n = write(fd, (const char *)data + off, bytes - off);
        if (n <= 0) die("%s", "write to a reducer");
        off += (uint64_t)n;
    }
}

typedef struct {
    int fd;
    part_t part;
} sender_t;

static void *send_part(void *arg) {
    sender_t *s = arg;
    part_header_t header = {.mapper = (uint32_t)job.id, .bytes = s->part.bytes};
    write_all(s->fd, &header, sizeof header);
    write_all(s->fd, s->part.data, s->part.bytes);
    shutdown(s->fd, SHUT_WR);
    char byte;
    if (read(s->fd, &byte, 1) != 0) die("%s", "a reducer said more than goodbye");
    close(s->fd);
    return NULL;
}

static void ship_tcp(part_t *parts) {
    sender_t senders[MAX_PEERS];
    pthread_t threads[MAX_PEERS];
    for (int r = 0; r < job.reducers; r++) senders[r] = (sender_t){connect_tcp(job.peers[r]), parts[r]};
    printf("shuffle_start_us %llu\n", (unsigned long long)now_us());
    for (int r = 0; r < job.reducers; r++) pthread_create(&threads[r], NULL, send_part, &senders[r]);
    for (int r = 0; r < job.reducers; r++) pthread_join(threads[r], NULL);
}

static int run_mapper(void) {
    uint64_t start = now_us();
    printf("start_us %llu\n", (unsigned long long)start);
    uint64_t first = job.pairs * (uint64_t)job.id / (uint64_t)job.mappers;
    uint64_t last = job.pairs * (uint64_t)(job.id + 1) / (uint64_t)job.mappers;
    uint64_t count[MAX_PEERS] = {0};
    for (uint64_t i = first; i < last; i++) count[reducer_of(key_of(i))]++;
    /* The map output: one buffer, a contiguous part per reducer. */
    pair_t *out = alloc_pages((last - first) * sizeof(pair_t));
    part_t parts[MAX_PEERS];
    uint64_t at[MAX_PEERS], offset = 0;
    for (int r = 0; r < job.reducers; r++) {
        parts[r] = (part_t){(char *)(out + offset), count[r] * sizeof(pair_t)};
        at[r] = offset, offset += count[r];
    }
    for (uint64_t i = first; i < last; i++) make_pair(&out[at[reducer_of(key_of(i))]++], i);
    if (job.rdma) ship_rdma(parts);
    else ship_tcp(parts);
    printf("mapper %d: %llu pairs shipped to %d reducers\nend_us %llu\n", job.id, (unsigned long long)(last - first),
           job.reducers, (unsigned long long)now_us());
    free(out);
    return 0;
}

/* ---- reducer ---- */

typedef struct {
    pair_t *pairs;
    uint64_t count;
} input_t;

static input_t inputs[MAX_PEERS];

static void receive_rdma(void) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *listener, *ids[MAX_PEERS];
    struct ibv_mr *mrs[MAX_PEERS];
    struct sockaddr_in addr;
    split_addr(job.listen, &addr);
    if (!ch || rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP)) die("%s", "rdma_create_id");
    if (rdma_bind_addr(listener, (struct sockaddr *)&addr)) die("rdma_bind_addr %s", job.listen);
    if (rdma_listen(listener, MAX_PEERS)) die("%s", "rdma_listen");
    printf("listening on %s\n", job.listen);
    fflush(stdout);
    struct ibv_pd *pd = NULL;
    struct ibv_comp_channel *channel = NULL;
    struct ibv_cq *cq = NULL;
    int connected = 0, arrived = 0, gone = 0, armed = 0;
    uint64_t data_in = 0;
    struct pollfd fds[2] = {{.fd = ch->fd, .events = POLLIN}, {.fd = -1, .events = POLLIN}};
    while (arrived < job.mappers || gone < job.mappers) {
        if (cq) {
            struct ibv_wc wc[16];
            int n = ibv_poll_cq(cq, 16, wc);
            for (int i = 0; i < n; i++) {
                check_wc(&wc[i]);
                if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM) die("%s", "a completion that is no WRITE_WITH_IMM");
                if (++arrived == job.mappers) data_in = now_us();
            }
            if (n) continue;
            /* Armed, then polled once more: a completion that came
             * between the poll and the request raises no event. */
            if (!armed) {
                if (ibv_req_notify_cq(cq, 0)) die("%s", "ibv_req_notify_cq");
                armed = 1;
                continue;
            }
        }
        if (poll(fds, cq ? 2 : 1, -1) < 0 && errno != EINTR) die("%s", "poll");
        if (cq && fds[1].revents) {
            struct ibv_cq *ev_cq;
            void *ctx;
            if (ibv_get_cq_event(channel, &ev_cq, &ctx)) die("%s", "ibv_get_cq_event");
            ibv_ack_cq_events(ev_cq, 1);
            armed = 0;
        }
        if (!fds[0].revents) continue;
        struct rdma_cm_event *event;
        if (rdma_get_cm_event(ch, &event)) die("%s", "rdma_get_cm_event");
        if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
            part_header_t header;
            if (event->param.conn.private_data_len < sizeof header) die("%s", "a connect request without its part's size");
            memcpy(&header, event->param.conn.private_data, sizeof header);
            int m = (int)header.mapper;
            if (m < 0 || m >= job.mappers || inputs[m].pairs || header.bytes % sizeof(pair_t)) die("%s", "a bad part header");
            struct rdma_cm_id *id = event->id;
            if (!pd) {
                pd = ibv_alloc_pd(id->verbs);
                channel = ibv_create_comp_channel(id->verbs);
                cq = channel ? ibv_create_cq(id->verbs, 2 * job.mappers, NULL, channel, 0) : NULL;
                if (!cq) die("%s", "cannot set up the device (PD, CQ)");
                fds[1].fd = channel->fd;
            }
            inputs[m] = (input_t){alloc_pages(header.bytes), header.bytes / sizeof(pair_t)};
            mrs[m] = ibv_reg_mr(pd, inputs[m].pairs, header.bytes ? header.bytes : 1,
                                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
            struct ibv_qp_init_attr attr = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                            .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
            if (!mrs[m] || rdma_create_qp(id, pd, &attr)) die("%s", "cannot register the part or create its QP");
            struct ibv_recv_wr wr = {.wr_id = (uint64_t)m, .num_sge = 0}, *bad;
            if (ibv_post_recv(id->qp, &wr, &bad)) die("%s", "ibv_post_recv");
            part_place_t place = {.addr = (uintptr_t)inputs[m].pairs, .rkey = mrs[m]->rkey};
            struct rdma_conn_param param = {.private_data = &place, .private_data_len = sizeof place,
                                            .responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7};
            ids[connected++] = id;
            if (rdma_accept(id, &param)) die("%s", "rdma_accept");
        } else if (event->event == RDMA_CM_EVENT_DISCONNECTED) {
            gone++;
        } else if (event->event != RDMA_CM_EVENT_ESTABLISHED) {
            errno = 0;
            die("unexpected connection event %s", rdma_event_str(event->event));
        }
        rdma_ack_cm_event(event);
    }
    printf("data_in_us %llu\n", (unsigned long long)data_in);
    for (int i = 0; i < connected; i++) rdma_destroy_qp(ids[i]), rdma_destroy_id(ids[i]);
    for (int m = 0; m < job.mappers; m++) ibv_dereg_mr(mrs[m]);
    ibv_destroy_cq(cq), ibv_destroy_comp_channel(channel), ibv_dealloc_pd(pd);
    rdma_destroy_id(listener), rdma_destroy_event_channel(ch);
}

static void read_all(int fd, void *data, uint64_t bytes) {
    for (uint64_t off = 0; off < bytes;) {
        ssize_t n = read(fd, (char *)data + off, bytes - off);
        if (n <= 0) die("%s", "a mapper's connection ended early");
        off += (uint64_t)n;
    }
}

static void *receive_part(void *arg) {
    int fd = (int)(intptr_t)arg;
    part_header_t header;
    read_all(fd, &header, sizeof header);
    int m = (int)header.mapper;
    if (m < 0 || m >= job.mappers || header.bytes % sizeof(pair_t)) die("%s", "a bad part header");
    input_t in = {alloc_pages(header.bytes), header.bytes / sizeof(pair_t)};
    read_all(fd, in.pairs, header.bytes);
    inputs[m] = in;
    close(fd);
    return NULL;
}

static void receive_tcp(void) {
    struct sockaddr_in addr;
    split_addr(job.listen, &addr);
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) || listen(lfd, MAX_PEERS)) die("cannot listen on %s", job.listen);
    printf("listening on %s\n", job.listen);
    fflush(stdout);
    pthread_t threads[MAX_PEERS];
    for (int i = 0; i < job.mappers; i++) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) die("%s", "accept");
        pthread_create(&threads[i], NULL, receive_part, (void *)(intptr_t)fd);
    }
    for (int i = 0; i < job.mappers; i++) pthread_join(threads[i], NULL);
    printf("data_in_us %llu\n", (unsigned long long)now_us());
    close(lfd);
    for (int m = 0; m < job.mappers; m++)
        if (!inputs[m].pairs) die("%s", "a mapper sent nothing");
}

/* GroupBy: the pairs of each key together (a table from key to group,
 * then each group's pairs listed). SortBy: the pairs in key order,
 * copied into the output. Returns the number of groups or pairs. */
typedef struct {
    uint64_t key, count, first;
} group_t;

static int by_key(const void *a, const void *b) {
    uint64_t x = (*(pair_t *const *)a)->key, y = (*(pair_t *const *)b)->key;
    return (x > y) - (x < y);
}

static uint64_t slot_of(uint64_t key, uint64_t mask) { return mix(key) & mask; }

static int reduce_and_check(uint64_t *groups_out) {
    uint64_t total = 0;
    for (int m = 0; m < job.mappers; m++) total += inputs[m].count;
    pair_t **all = malloc((total + 1) * sizeof(pair_t *));
    uint64_t n = 0;
    for (int m = 0; m < job.mappers; m++)
        for (uint64_t i = 0; i < inputs[m].count; i++) all[n++] = &inputs[m].pairs[i];
    int errors = 0;
    uint64_t cap = 1;
    while (cap < 2 * (total + 1)) cap <<= 1;
    group_t *table = NULL;
    pair_t *sorted = NULL;
    if (job.sortby) {
        qsort(all, total, sizeof *all, by_key);
        sorted = alloc_pages(total * sizeof(pair_t));
        for (uint64_t i = 0; i < total; i++) memcpy(&sorted[i], all[i], sizeof(pair_t));
        *groups_out = total;
    } else {
        table = calloc(cap, sizeof(group_t));
        uint64_t ngroups = 0;
        for (uint64_t i = 0; i < total; i++) {
            uint64_t s = slot_of(all[i]->key, cap - 1);
            while (table[s].count && table[s].key != all[i]->key) s = (s + 1) & (cap - 1);
            if (!table[s].count) table[s].key = all[i]->key, ngroups++;
            table[s].count++;
        }
        /* Each group's pairs, listed together: counting sort by slot. */
        uint64_t at = 0;
        for (uint64_t s = 0; s < cap; s++) table[s].first = at, at += table[s].count;
        pair_t **grouped = malloc((total + 1) * sizeof(pair_t *));
        uint64_t *fill = malloc(cap * sizeof(uint64_t));
        for (uint64_t s = 0; s < cap; s++) fill[s] = table[s].first;
        for (uint64_t i = 0; i < total; i++) {
            uint64_t s = slot_of(all[i]->key, cap - 1);
            while (table[s].key != all[i]->key) s = (s + 1) & (cap - 1);
            grouped[fill[s]++] = all[i];
        }
        free(fill);
        free(all);
        all = grouped;
        *groups_out = ngroups;
    }
    printf("end_us %llu\n", (unsigned long long)now_us());
    fflush(stdout);

    /* The check, outside the job's time: every pair this reducer should
     * have, exactly once and intact; every group complete; the sort in
     * order. */
    uint8_t *seen = calloc(job.pairs / 8 + 1, 1);
    for (uint64_t i = 0; i < total; i++) {
        const pair_t *p = job.sortby ? &sorted[i] : all[i];
        if (!pair_intact(p)) {
            if (errors++ < 5) fprintf(stderr, "reducer %d: pair %llu is not what its mapper made\n", job.id, (unsigned long long)i);
            continue;
        }
        if (seen[p->index / 8] & (1 << (p->index % 8))) {
            if (errors++ < 5) fprintf(stderr, "reducer %d: pair %llu twice\n", job.id, (unsigned long long)p->index);
        }
        seen[p->index / 8] |= (uint8_t)(1 << (p->index % 8));
        if (job.sortby && i > 0 && sorted[i - 1].key > p->key && errors++ < 5)
            fprintf(stderr, "reducer %d: pairs %llu and %llu out of order\n", job.id, (unsigned long long)i - 1, (unsigned long long)i);
    }
    uint64_t missing = 0;
    for (uint64_t index = 0; index < job.pairs; index++) {
        uint64_t key = key_of(index);
        if (reducer_of(key) != job.id) continue;
        if (!(seen[index / 8] & (1 << (index % 8)))) missing++;
        if (table) {
            /* The group holds this pair: it is in the group's listing. */
            uint64_t s = slot_of(key, cap - 1);
            while (table[s].count && table[s].key != key) s = (s + 1) & (cap - 1);
            int found = 0;
            for (uint64_t j = table[s].first; table[s].count && j < table[s].first + table[s].count && !found; j++)
                found = all[j]->index == index;
            if (!found && errors++ < 5)
                fprintf(stderr, "reducer %d: group %llu lacks pair %llu\n", job.id, (unsigned long long)key, (unsigned long long)index);
        }
    }
    if (missing) fprintf(stderr, "reducer %d: %llu pairs missing\n", job.id, (unsigned long long)missing), errors++;
    if (table) {
        /* Each listing holds its own key's pairs only. */
        for (uint64_t s = 0; s < cap; s++)
            for (uint64_t j = table[s].first; j < table[s].first + table[s].count; j++)
                if (all[j]->key != table[s].key && errors++ < 5)
                    fprintf(stderr, "reducer %d: group %llu holds a pair of key %llu\n", job.id, (unsigned long long)table[s].key, (unsigned long long)all[j]->key);
    }
    printf("reducer %d: %llu pairs, %llu %s, %s\n", job.id, (unsigned long long)total, (unsigned long long)*groups_out,
           job.sortby ? "sorted" : "groups", errors ? "CHECK FAILED" : "checked: every pair once and intact");
    free(seen), free(table), free(sorted), free(all);
    return errors ? 1 : 0;
}

static int run_reducer(void) {
    if (job.rdma) receive_rdma();
    else receive_tcp();
    uint64_t groups_found;
    return reduce_and_check(&groups_found);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2 || (strcmp(argv[1], "mapper") && strcmp(argv[1], "reducer"))) {
        fprintf(stderr, "usage: shuffle mapper|reducer -i ID -m MAPPERS -p PAIRS -o groupby|sortby -t rdma|tcp\n"
                        "       (mapper: -r ADDR:PORT,...; reducer: -l ADDR:PORT -n REDUCERS)\n");
        return 2;
    }
    job.mapper = !strcmp(argv[1], "mapper");
    job.rdma = 1, job.mappers = 8, job.pairs = 262144;
    int opt;
    optind = 2;
    while ((opt = getopt(argc, argv, "i:m:n:p:o:t:r:l:")) != -1) {
        switch (opt) {
        case 'i': job.id = atoi(optarg); break;
        case 'm': job.mappers = atoi(optarg); break;
        case 'n': job.reducers = atoi(optarg); break;
        case 'p': job.pairs = strtoull(optarg, NULL, 10); break;
        case 'o':
            if (strcmp(optarg, "groupby") && strcmp(optarg, "sortby")) die("-o %s: write groupby or sortby", optarg);
            job.sortby = !strcmp(optarg, "sortby");
            break;
        case 't':
            if (strcmp(optarg, "rdma") && strcmp(optarg, "tcp")) die("-t %s: write rdma or tcp", optarg);
            job.rdma = !strcmp(optarg, "rdma");
            break;
        case 'r':
            for (char *p = strtok(optarg, ","); p; p = strtok(NULL, ",")) {
                if (job.reducers == MAX_PEERS) die("more than %s reducers", "64");
                job.peers[job.reducers++] = p;
            }
            break;
        case 'l': job.listen = optarg; break;
        default: return 2;
        }
    }
    errno = 0;
    if (job.mappers < 1 || job.mappers > MAX_PEERS || job.reducers < 1 || job.reducers > MAX_PEERS || job.pairs < 1)
        die("%s", "needs 1 to 64 mappers and reducers and at least one pair (-m, -n or -r, -p)");
    if (job.id < 0 || job.id >= (job.mapper ? job.mappers : job.reducers)) die("%s", "-i is not one of the job's numbers");
    if (!job.mapper && !job.listen) die("%s", "a reducer needs -l ADDR:PORT");
    return job.mapper ? run_mapper() : run_reducer();
}
