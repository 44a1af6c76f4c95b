/* Graph 500's BFS (kernel 2) and SSSP (kernel 3) as an MPI program, the
 * way the specification (graph500.org, version 3) defines them:
 *
 *   - a Kronecker graph of 2^SCALE vertices and EDGEFACTOR * 2^SCALE
 *     undirected edges (initiator A = 0.57, B = 0.19, C = 0.19), vertex
 *     labels permuted, each edge a weight uniform in [0, 1);
 *   - kernel 1 builds the distributed graph from the edge list (timed);
 *   - for each of NBFS search keys (random vertices with an edge that is
 *     no self-loop, none twice) a BFS and an SSSP, each timed, and each
 *     result validated against the edge list as the specification says
 *     (a tree rooted at the key and free of cycles, every edge of the
 *     graph either inside the tree's component or outside it, levels
 *     that differ by at most one across an edge, distances no edge can
 *     shorten, each tree edge an edge of the graph);
 *   - the statistics in the reference code's output format, TEPS as the
 *     harmonic mean with Norris's standard error.
 *
 *   mpicc -O2 -o graph500 graph500.c -lm
 *   mpirun -np 16 ./graph500 -s SCALE [-e EDGEFACTOR] [-n NBFS] [-S SEED]
 *
 * Vertices are dealt to ranks in blocks; a search is level-synchronous
 * (BFS) or label-correcting Bellman-Ford over an active set (SSSP), each
 * round one MPI_Alltoallv of the messages for other ranks' vertices, so
 * every round crosses the transport under test. Exits 1 if any search
 * fails its validation. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define A_PARAM 0.57
#define B_PARAM 0.19
#define C_PARAM 0.19
/* Distances are sums of floats: a tree edge's and an edge's inequality
 * hold to this much. */
#define DIST_SLACK 1e-5

static int rank, nranks;
static int64_t nvertices, per_rank; /* per_rank: the block each rank owns */

typedef struct {
    int64_t u, v;
    float w;
} edge_t;

static void die(const char *what) {
    fprintf(stderr, "graph500 (rank %d): %s\n", rank, what);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die("out of memory");
    return p;
}

static int owner(int64_t v) { return (int)(v / per_rank); }
static int64_t local(int64_t v) { return v - (int64_t)rank * per_rank; }
static int64_t local_count(void) {
    int64_t first = (int64_t)rank * per_rank;
    int64_t n = nvertices - first;
    return n < 0 ? 0 : (n > per_rank ? per_rank : n);
}

/* ---- random numbers: each edge's draw depends on the seed and its index
 * alone, so every rank generates its share without the others. ---- */

static uint64_t splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *state) { return (double)(splitmix(state) >> 11) * 0x1.0p-53; }

/* A bijection on SCALE-bit labels (multiplying by an odd number, folding
 * the high half into the low, adding a key: each step invertible), so
 * vertex numbers carry nothing of the Kronecker structure. */
static int64_t permute(int64_t v, int scale, uint64_t seed) {
    uint64_t mask = scale >= 64 ? ~0ull : (1ull << scale) - 1, x = (uint64_t)v;
    uint64_t keys[3] = {seed * 0xD6E8FEB86659FD93ull, seed ^ 0xA0761D6478BD642Full, seed + 0xE7037ED1A0B428DBull};
    for (int round = 0; round < 3; round++) {
        x = (x * 0x9E3779B97F4A7C15ull) & mask;
        x ^= x >> (scale / 2 + 1);
        x = (x + keys[round]) & mask;
    }
    return (int64_t)x;
}

static edge_t kronecker_edge(int64_t index, int scale, uint64_t seed) {
    uint64_t state = seed ^ ((uint64_t)index * 0x2545F4914F6CDD1Dull);
    int64_t u = 0, v = 0;
    for (int level = 0; level < scale; level++) {
        double r = uniform(&state);
        int down = r >= A_PARAM + B_PARAM, right = (r >= A_PARAM && r < A_PARAM + B_PARAM) || r >= A_PARAM + B_PARAM + C_PARAM;
        u = (u << 1) | down;
        v = (v << 1) | right;
    }
    edge_t e = {permute(u, scale, seed), permute(v, scale, seed), (float)uniform(&state)};
    return e;
}

/* ---- all-to-all in fixed-width records: the one communication pattern.
 * Records bound for rank d go in bucket d; an answer comes back in the
 * slot its question left from. ---- */

typedef struct {
    size_t width;     /* bytes per record */
    int *send_counts; /* records per destination */
    int *send_displs;
    int *recv_counts;
    int *recv_displs;
    char *send, *recv;
    int64_t nsend, nrecv;
    int64_t *slot;    /* where question i sits in `send` */
    MPI_Datatype type;
} exchange_t;

static void exchange_init(exchange_t *x, size_t width) {
    memset(x, 0, sizeof *x);
    x->width = width;
    x->send_counts = xmalloc(nranks * sizeof(int));
    x->send_displs = xmalloc(nranks * sizeof(int));
    x->recv_counts = xmalloc(nranks * sizeof(int));
    x->recv_displs = xmalloc(nranks * sizeof(int));
    MPI_Type_contiguous((int)width, MPI_BYTE, &x->type);
    MPI_Type_commit(&x->type);
}

static void exchange_free(exchange_t *x) {
    free(x->send_counts), free(x->send_displs), free(x->recv_counts), free(x->recv_displs);
    free(x->send), free(x->recv), free(x->slot);
    MPI_Type_free(&x->type);
}

/* Places n records (record i for rank dest[i]) into buckets and swaps
 * them: afterwards x->recv holds x->nrecv records from every rank. */
static void exchange(exchange_t *x, const void *records, const int *dest, int64_t n) {
    memset(x->send_counts, 0, nranks * sizeof(int));
    for (int64_t i = 0; i < n; i++) x->send_counts[dest[i]]++;
    MPI_Alltoall(x->send_counts, 1, MPI_INT, x->recv_counts, 1, MPI_INT, MPI_COMM_WORLD);
    int64_t sent = 0, received = 0;
    for (int r = 0; r < nranks; r++) {
        x->send_displs[r] = (int)sent, sent += x->send_counts[r];
        x->recv_displs[r] = (int)received, received += x->recv_counts[r];
    }
    if (sent > INT32_MAX || received > INT32_MAX) die("more than 2^31 records in one exchange: use more ranks");
    free(x->send), free(x->recv), free(x->slot);
    x->send = xmalloc(sent * x->width);
    x->recv = xmalloc(received * x->width);
    x->slot = xmalloc(n * sizeof(int64_t));
    x->nsend = sent, x->nrecv = received;
    int *fill = xmalloc(nranks * sizeof(int));
    memcpy(fill, x->send_displs, nranks * sizeof(int));
    for (int64_t i = 0; i < n; i++) {
        x->slot[i] = fill[dest[i]]++;
        memcpy(x->send + x->slot[i] * x->width, (const char *)records + i * x->width, x->width);
    }
    free(fill);
    MPI_Alltoallv(x->send, x->send_counts, x->send_displs, x->type, x->recv, x->recv_counts, x->recv_displs, x->type,
                  MPI_COMM_WORLD);
}

/* Sends `answers` (one of width `width` per record received) back where
 * the questions came from; answer to question i is then at
 * out + x->slot[i] * width. */
static void *answer(exchange_t *x, const void *answers, size_t width) {
    MPI_Datatype type;
    MPI_Type_contiguous((int)width, MPI_BYTE, &type);
    MPI_Type_commit(&type);
    void *out = xmalloc(x->nsend * width);
    MPI_Alltoallv(answers, x->recv_counts, x->recv_displs, type, out, x->send_counts, x->send_displs, type,
                  MPI_COMM_WORLD);
    MPI_Type_free(&type);
    return out;
}

/* ---- kernel 1: the graph in compressed rows, each rank its vertices'. ---- */

typedef struct {
    int64_t nlocal;
    int64_t *row; /* nlocal + 1 */
    int64_t *col; /* neighbours, global numbers */
    float *weight;
} graph_t;

typedef struct {
    int64_t from, to;
    float w;
} arc_t;

static graph_t build_graph(const edge_t *edges, int64_t nedges) {
    arc_t *arcs = xmalloc(2 * nedges * sizeof(arc_t));
    int *dest = xmalloc(2 * nedges * sizeof(int));
    int64_t n = 0;
    for (int64_t i = 0; i < nedges; i++) {
        const edge_t *e = &edges[i];
        if (e->u == e->v) continue; /* a self-loop leads nowhere */
        arcs[n] = (arc_t){e->u, e->v, e->w}, dest[n++] = owner(e->u);
        arcs[n] = (arc_t){e->v, e->u, e->w}, dest[n++] = owner(e->v);
    }
    exchange_t x;
    exchange_init(&x, sizeof(arc_t));
    exchange(&x, arcs, dest, n);
    free(arcs), free(dest);
    graph_t g = {.nlocal = local_count()};
    g.row = calloc(g.nlocal + 1, sizeof(int64_t));
    g.col = xmalloc(x.nrecv * sizeof(int64_t));
    g.weight = xmalloc(x.nrecv * sizeof(float));
    const arc_t *in = (const arc_t *)x.recv;
    for (int64_t i = 0; i < x.nrecv; i++) g.row[local(in[i].from) + 1]++;
    for (int64_t v = 0; v < g.nlocal; v++) g.row[v + 1] += g.row[v];
    int64_t *fill = xmalloc((g.nlocal + 1) * sizeof(int64_t));
    memcpy(fill, g.row, (g.nlocal + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < x.nrecv; i++) {
        int64_t at = fill[local(in[i].from)]++;
        g.col[at] = in[i].to, g.weight[at] = in[i].w;
    }
    free(fill);
    exchange_free(&x);
    return g;
}

/* ---- kernel 2: breadth-first search, a level a round. ---- */

typedef struct {
    int64_t vertex, parent;
} visit_t;

static void bfs(const graph_t *g, int64_t root, int64_t *parent) {
    for (int64_t v = 0; v < g->nlocal; v++) parent[v] = -1;
    int64_t *frontier = xmalloc((g->nlocal + 1) * sizeof(int64_t)), *next = xmalloc((g->nlocal + 1) * sizeof(int64_t));
    int64_t nfrontier = 0;
    if (owner(root) == rank) parent[local(root)] = root, frontier[nfrontier++] = local(root);
    exchange_t x;
    exchange_init(&x, sizeof(visit_t));
    for (;;) {
        int64_t nout = 0;
        for (int64_t i = 0; i < nfrontier; i++) nout += g->row[frontier[i] + 1] - g->row[frontier[i]];
        visit_t *out = xmalloc(nout * sizeof(visit_t));
        int *dest = xmalloc(nout * sizeof(int));
        int64_t k = 0;
        for (int64_t i = 0; i < nfrontier; i++) {
            int64_t u = frontier[i], from = u + (int64_t)rank * per_rank;
            for (int64_t a = g->row[u]; a < g->row[u + 1]; a++) {
                out[k] = (visit_t){g->col[a], from}, dest[k++] = owner(g->col[a]);
            }
        }
        exchange(&x, out, dest, nout);
        free(out), free(dest);
        int64_t nnext = 0;
        const visit_t *in = (const visit_t *)x.recv;
        for (int64_t i = 0; i < x.nrecv; i++) {
            int64_t v = local(in[i].vertex);
            if (parent[v] < 0) parent[v] = in[i].parent, next[nnext++] = v;
        }
        int64_t total;
        MPI_Allreduce(&nnext, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        int64_t *t = frontier;
        frontier = next, next = t, nfrontier = nnext;
        if (total == 0) break;
    }
    exchange_free(&x);
    free(frontier), free(next);
}

/* ---- kernel 3: single-source shortest paths, Bellman-Ford over the
 * vertices whose distance fell in the last round. ---- */

typedef struct {
    int64_t vertex, parent;
    double dist;
} relax_t;

static void sssp(const graph_t *g, int64_t root, int64_t *parent, double *dist) {
    for (int64_t v = 0; v < g->nlocal; v++) parent[v] = -1, dist[v] = INFINITY;
    int64_t *active = xmalloc((g->nlocal + 1) * sizeof(int64_t));
    char *queued = calloc(g->nlocal + 1, 1);
    int64_t nactive = 0;
    if (owner(root) == rank) parent[local(root)] = root, dist[local(root)] = 0, active[nactive++] = local(root);
    exchange_t x;
    exchange_init(&x, sizeof(relax_t));
    for (;;) {
        int64_t nout = 0;
        for (int64_t i = 0; i < nactive; i++) nout += g->row[active[i] + 1] - g->row[active[i]];
        relax_t *out = xmalloc(nout * sizeof(relax_t));
        int *dest = xmalloc(nout * sizeof(int));
        int64_t k = 0;
        for (int64_t i = 0; i < nactive; i++) {
            int64_t u = active[i], from = u + (int64_t)rank * per_rank;
            for (int64_t a = g->row[u]; a < g->row[u + 1]; a++) {
                out[k] = (relax_t){g->col[a], from, dist[u] + g->weight[a]}, dest[k++] = owner(g->col[a]);
            }
        }
        exchange(&x, out, dest, nout);
        free(out), free(dest);
        nactive = 0;
        const relax_t *in = (const relax_t *)x.recv;
        for (int64_t i = 0; i < x.nrecv; i++) {
            int64_t v = local(in[i].vertex);
            if (in[i].dist < dist[v]) {
                dist[v] = in[i].dist, parent[v] = in[i].parent;
                if (!queued[v]) queued[v] = 1, active[nactive++] = v;
            }
        }
        for (int64_t i = 0; i < nactive; i++) queued[active[i]] = 0;
        int64_t total;
        MPI_Allreduce(&nactive, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (total == 0) break;
    }
    exchange_free(&x);
    free(active), free(queued);
}

/* ---- validation, as the specification lists it. `dist` is NULL for a
 * BFS (its levels are the tree's depths). Returns the number of input
 * edges in the searched component (the TEPS numerator), or -1 with the
 * failure said on stderr. ---- */

typedef struct {
    int64_t parent, depth;
    double dist;
} state_t;

static int64_t validate(const char *kind, int64_t root, const edge_t *edges, int64_t nedges, const int64_t *parent,
                        const double *dist) {
    int64_t nlocal = local_count(), errors = 0;
    /* Depths in the tree, a level per round: a vertex learns its parent's
     * depth once the parent has one. A round in which nobody learns
     * anything while some still do not know means a cycle. */
    int64_t *depth = xmalloc((nlocal + 1) * sizeof(int64_t));
    for (int64_t v = 0; v < nlocal; v++) {
        depth[v] = -1;
        if (parent[v] < -1 || parent[v] >= nvertices) {
            fprintf(stderr, "%s from %lld: %lld's parent %lld is no vertex\n", kind, (long long)root,
                    (long long)(v + (int64_t)rank * per_rank), (long long)parent[v]);
            errors++;
        }
    }
    int64_t bad_parents;
    MPI_Allreduce(&errors, &bad_parents, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (bad_parents) {
        free(depth);
        return -1;
    }
    if (owner(root) == rank) {
        int64_t r = local(root);
        if (parent[r] != root) fprintf(stderr, "%s from %lld: the root's parent is %lld\n", kind, (long long)root, (long long)parent[r]), errors++;
        if (dist && dist[r] != 0) fprintf(stderr, "%s from %lld: the root's distance is %g\n", kind, (long long)root, dist[r]), errors++;
        depth[r] = 0;
    }
    exchange_t x;
    exchange_init(&x, sizeof(int64_t));
    for (;;) {
        int64_t nask = 0;
        for (int64_t v = 0; v < nlocal; v++) nask += parent[v] >= 0 && depth[v] < 0;
        int64_t *ask = xmalloc(nask * sizeof(int64_t)), *who = xmalloc(nask * sizeof(int64_t));
        int *dest = xmalloc(nask * sizeof(int));
        int64_t k = 0;
        for (int64_t v = 0; v < nlocal; v++) {
            if (parent[v] >= 0 && depth[v] < 0) ask[k] = parent[v], who[k] = v, dest[k] = owner(parent[v]), k++;
        }
        int64_t unknown_total;
        MPI_Allreduce(&nask, &unknown_total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (unknown_total == 0) {
            free(ask), free(who), free(dest);
            break;
        }
        exchange(&x, ask, dest, nask);
        int64_t *depths = xmalloc((x.nrecv + 1) * sizeof(int64_t));
        for (int64_t i = 0; i < x.nrecv; i++) depths[i] = depth[local(((int64_t *)x.recv)[i])];
        int64_t *got = answer(&x, depths, sizeof(int64_t));
        int64_t learned = 0;
        for (int64_t i = 0; i < nask; i++) {
            int64_t d = got[x.slot[i]];
            if (d >= 0) depth[who[i]] = d + 1, learned++;
        }
        free(ask), free(who), free(dest), free(depths), free(got);
        int64_t learned_total;
        MPI_Allreduce(&learned, &learned_total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (learned_total == 0) {
            if (rank == 0) fprintf(stderr, "%s from %lld: %lld vertices' parents lead to no root (a cycle)\n", kind, (long long)root, (long long)unknown_total);
            errors++;
            break;
        }
    }
    exchange_free(&x);

    /* Every input edge against both ends' state. */
    int64_t *ends = xmalloc(2 * nedges * sizeof(int64_t) + 1);
    int *dest = xmalloc(2 * nedges * sizeof(int) + 1);
    for (int64_t i = 0; i < nedges; i++) {
        ends[2 * i] = edges[i].u, dest[2 * i] = owner(edges[i].u);
        ends[2 * i + 1] = edges[i].v, dest[2 * i + 1] = owner(edges[i].v);
    }
    exchange_init(&x, sizeof(int64_t));
    exchange(&x, ends, dest, 2 * nedges);
    state_t *states = xmalloc((x.nrecv + 1) * sizeof(state_t));
    for (int64_t i = 0; i < x.nrecv; i++) {
        int64_t v = local(((int64_t *)x.recv)[i]);
        states[i] = (state_t){parent[v], depth[v], dist ? dist[v] : (double)depth[v]};
    }
    state_t *got = answer(&x, states, sizeof(state_t));
    free(states);
    /* The tree edges found in the graph: each vertex but the root needs
     * one edge to its parent, at the right level or distance. */
    int64_t *found = xmalloc(2 * nedges * sizeof(int64_t) + 1);
    int *found_dest = xmalloc(2 * nedges * sizeof(int) + 1);
    int64_t nfound = 0, nedge = 0;
    for (int64_t i = 0; i < nedges; i++) {
        const edge_t *e = &edges[i];
        state_t su = got[x.slot[2 * i]], sv = got[x.slot[2 * i + 1]];
        int in_u = su.depth >= 0, in_v = sv.depth >= 0;
        if (in_u != in_v) {
            if (errors++ < 5) fprintf(stderr, "%s from %lld: edge %lld-%lld leaves the searched component\n", kind, (long long)root, (long long)e->u, (long long)e->v);
            continue;
        }
        if (!in_u) continue;
        nedge++;
        if (e->u == e->v) continue;
        if (!dist) {
            if (llabs(su.depth - sv.depth) > 1 && errors++ < 5)
                fprintf(stderr, "bfs from %lld: edge %lld-%lld joins levels %lld and %lld\n", (long long)root, (long long)e->u, (long long)e->v, (long long)su.depth, (long long)sv.depth);
        } else if ((sv.dist > su.dist + e->w + DIST_SLACK || su.dist > sv.dist + e->w + DIST_SLACK) && errors++ < 5) {
            fprintf(stderr, "sssp from %lld: edge %lld-%lld of weight %g shortens %g or %g\n", (long long)root, (long long)e->u, (long long)e->v, e->w, su.dist, sv.dist);
        }
        for (int side = 0; side < 2; side++) {
            state_t child = side ? su : sv, up = side ? sv : su;
            int64_t c = side ? e->u : e->v, p = side ? e->v : e->u;
            int fits = dist ? fabs(child.dist - (up.dist + e->w)) <= DIST_SLACK : child.depth == up.depth + 1;
            if (child.parent == p && c != root && fits) found[nfound] = c, found_dest[nfound++] = owner(c);
        }
    }
    free(got), free(ends), free(dest);
    exchange_free(&x);
    exchange_init(&x, sizeof(int64_t));
    exchange(&x, found, found_dest, nfound);
    char *has_edge = calloc(nlocal + 1, 1);
    for (int64_t i = 0; i < x.nrecv; i++) has_edge[local(((int64_t *)x.recv)[i])] = 1;
    for (int64_t v = 0; v < nlocal; v++) {
        int64_t global = v + (int64_t)rank * per_rank;
        if (parent[v] >= 0 && global != root && !has_edge[v] && errors++ < 5)
            fprintf(stderr, "%s from %lld: %lld's parent %lld is no neighbour at the right %s\n", kind, (long long)root, (long long)global, (long long)parent[v], dist ? "distance" : "level");
    }
    free(has_edge), free(found), free(found_dest), free(depth);
    exchange_free(&x);
    int64_t totals[2], mine[2] = {errors, nedge};
    MPI_Allreduce(mine, totals, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return totals[0] ? -1 : totals[1];
}

/* ---- statistics, in the reference code's shape ---- */

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double min, q1, median, q3, max, mean, stddev;
} stats_t;

static stats_t statistics(const double *values, int n) {
    double *x = xmalloc(n * sizeof(double));
    memcpy(x, values, n * sizeof(double));
    qsort(x, n, sizeof(double), by_value);
    stats_t s = {x[0], (x[(n - 1) / 4] + x[n / 4]) / 2, (x[(n - 1) / 2] + x[n / 2]) / 2,
                 (x[n - 1 - (n - 1) / 4] + x[n - 1 - n / 4]) / 2, x[n - 1], 0, 0};
    for (int i = 0; i < n; i++) s.mean += x[i] / n;
    for (int i = 0; i < n; i++) s.stddev += (x[i] - s.mean) * (x[i] - s.mean);
    s.stddev = n > 1 ? sqrt(s.stddev / (n - 1)) : 0;
    free(x);
    return s;
}

static void print_kernel(const char *kind, const double *times, const double *nedges, const double *validate, int n,
                         int print_nedge) {
    stats_t t = statistics(times, n);
    printf("%s min_time:                  %g\n%s firstquartile_time:        %g\n%s median_time:               %g\n", kind, t.min, kind, t.q1, kind, t.median);
    printf("%s thirdquartile_time:        %g\n%s max_time:                  %g\n%s mean_time:                 %g\n", kind, t.q3, kind, t.max, kind, t.mean);
    printf("%s stddev_time:               %g\n", kind, t.stddev);
    if (print_nedge) {
        stats_t e = statistics(nedges, n);
        printf("min_nedge:                      %.11g\nfirstquartile_nedge:            %.11g\nmedian_nedge:                   %.11g\n", e.min, e.q1, e.median);
        printf("thirdquartile_nedge:            %.11g\nmax_nedge:                      %.11g\nmean_nedge:                     %.11g\n", e.q3, e.max, e.mean);
        printf("stddev_nedge:                   %.11g\n", e.stddev);
    }
    /* TEPS statistics from seconds per edge: the harmonic mean of TEPS is
     * the inverse of the mean seconds per edge (Norris, 1940, for its
     * standard error). */
    double *spe = xmalloc(n * sizeof(double));
    for (int i = 0; i < n; i++) spe[i] = times[i] / nedges[i];
    stats_t s = statistics(spe, n);
    printf("%s min_TEPS:                  %g\n%s firstquartile_TEPS:        %g\n%s median_TEPS:               %g\n", kind, 1 / s.max, kind, 1 / s.q3, kind, 1 / s.median);
    printf("%s thirdquartile_TEPS:        %g\n%s max_TEPS:                  %g\n", kind, 1 / s.q1, kind, 1 / s.min);
    printf("%s harmonic_mean_TEPS:     !  %g\n", kind, 1 / s.mean);
    printf("%s harmonic_stddev_TEPS:      %g\n", kind, n > 1 ? s.stddev / (s.mean * s.mean * sqrt(n - 1)) : 0);
    free(spe);
    stats_t v = statistics(validate, n);
    printf("%s min_validate:              %g\n%s firstquartile_validate:    %g\n%s median_validate:           %g\n", kind, v.min, kind, v.q1, kind, v.median);
    printf("%s thirdquartile_validate:    %g\n%s max_validate:              %g\n%s mean_validate:             %g\n", kind, v.q3, kind, v.max, kind, v.mean);
    printf("%s stddev_validate:           %g\n", kind, v.stddev);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    int scale = 16, edgefactor = 16, nroots = 64, opt;
    uint64_t seed = 1;
    while ((opt = getopt(argc, argv, "s:e:n:S:")) != -1) {
        switch (opt) {
        case 's': scale = atoi(optarg); break;
        case 'e': edgefactor = atoi(optarg); break;
        case 'n': nroots = atoi(optarg); break;
        case 'S': seed = strtoull(optarg, NULL, 10); break;
        default:
            if (rank == 0) fprintf(stderr, "usage: graph500 [-s SCALE] [-e EDGEFACTOR] [-n NBFS] [-S SEED]\n");
            MPI_Finalize();
            return 2;
        }
    }
    if (scale < 1 || scale > 40 || edgefactor < 1 || nroots < 1) {
        if (rank == 0) fprintf(stderr, "graph500: SCALE must be 1..40, EDGEFACTOR and NBFS at least 1\n");
        MPI_Finalize();
        return 2;
    }
    nvertices = (int64_t)1 << scale;
    per_rank = (nvertices + nranks - 1) / nranks;
    int64_t nedges_total = (int64_t)edgefactor << scale;
    int64_t first = nedges_total * rank / nranks, nedges = nedges_total * (rank + 1) / nranks - first;

    double t = MPI_Wtime();
    edge_t *edges = xmalloc(nedges * sizeof(edge_t));
    for (int64_t i = 0; i < nedges; i++) edges[i] = kronecker_edge(first + i, scale, seed);
    double generation = MPI_Wtime() - t;
    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    graph_t g = build_graph(edges, nedges);
    MPI_Barrier(MPI_COMM_WORLD);
    double construction = MPI_Wtime() - t;

    /* Search keys: the same pseudo-random candidates on every rank; the
     * owner says whether one has an edge that is no self-loop. */
    int64_t *roots = xmalloc(nroots * sizeof(int64_t));
    uint64_t pick = seed ^ 0x5851F42D4C957F2Dull;
    int found = 0;
    for (int64_t tries = 0; found < nroots; tries++) {
        if (tries > 64 * nvertices) die("the graph has too few vertices with an edge for that many search keys");
        int64_t v = (int64_t)(splitmix(&pick) % (uint64_t)nvertices);
        int has = 0, any;
        if (owner(v) == rank) {
            int64_t lv = local(v);
            for (int64_t a = g.row[lv]; a < g.row[lv + 1] && !has; a++) has = g.col[a] != v;
        }
        MPI_Allreduce(&has, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
        for (int i = 0; i < found && any; i++) any = roots[i] != v;
        if (any) roots[found++] = v;
    }

    int64_t *parent = xmalloc((g.nlocal + 1) * sizeof(int64_t));
    double *dist = xmalloc((g.nlocal + 1) * sizeof(double));
    double *bfs_time = xmalloc(nroots * sizeof(double)), *sssp_time = xmalloc(nroots * sizeof(double));
    double *bfs_edges = xmalloc(nroots * sizeof(double)), *sssp_edges = xmalloc(nroots * sizeof(double));
    double *bfs_check = xmalloc(nroots * sizeof(double)), *sssp_check = xmalloc(nroots * sizeof(double));
    int failed = 0;
    for (int i = 0; i < nroots; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        t = MPI_Wtime();
        bfs(&g, roots[i], parent);
        bfs_time[i] = MPI_Wtime() - t;
        t = MPI_Wtime();
        int64_t n = validate("bfs", roots[i], edges, nedges, parent, NULL);
        bfs_check[i] = MPI_Wtime() - t;
        failed |= n < 0, bfs_edges[i] = n > 0 ? (double)n : 1;

        MPI_Barrier(MPI_COMM_WORLD);
        t = MPI_Wtime();
        sssp(&g, roots[i], parent, dist);
        sssp_time[i] = MPI_Wtime() - t;
        t = MPI_Wtime();
        n = validate("sssp", roots[i], edges, nedges, parent, dist);
        sssp_check[i] = MPI_Wtime() - t;
        failed |= n < 0, sssp_edges[i] = n > 0 ? (double)n : 1;
        if (rank == 0 && getenv("GRAPH500_VERBOSE"))
            fprintf(stderr, "key %d (%lld): bfs %g s, sssp %g s, %.0f edges\n", i, (long long)roots[i], bfs_time[i], sssp_time[i], bfs_edges[i]);
    }

    if (rank == 0) {
        printf("SCALE:                          %d\nedgefactor:                     %d\nNBFS:                           %d\n", scale, edgefactor, nroots);
        printf("graph_generation:               %g\nnum_mpi_processes:              %d\nconstruction_time:              %g\n", generation, nranks, construction);
        print_kernel("bfs ", bfs_time, bfs_edges, bfs_check, nroots, 1);
        print_kernel("sssp", sssp_time, sssp_edges, sssp_check, nroots, 0);
        printf("validation:                     %s\n", failed ? "FAILED" : "passed (every BFS tree and SSSP distance array)");
    }
    MPI_Finalize();
    return failed ? 1 : 0;
}
