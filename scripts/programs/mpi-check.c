/* An MPI program that checks what it measures, for scripts/stack-matrix.py
 * and scripts/bench.py: run with two ranks.
 *
 *   ping-pong   8 B half round trip, and 1 MiB bandwidth (rank 0 to 1,
 *               the reply is 8 bytes), every received buffer checked;
 *   allreduce   MPI_SUM of 64 Ki doubles, checked against the exact sum
 *               (small integers, so the floating-point sum is exact);
 *   put         MPI_Put into the other rank's window between fences
 *               (one-sided: Open MPI's osc ucx), checked.
 *
 * Prints one line per part, "name: figure", and exits non-zero on any
 * wrong byte. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); MPI_Abort(MPI_COMM_WORLD, 1); } while (0)

static double pingpong(int rank, size_t size, int iters, unsigned char *buf)
{
    unsigned char reply[8];
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (rank == 0) {
            memset(buf, (unsigned char)i, size);
            MPI_Send(buf, (int)size, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(reply, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (reply[0] != (unsigned char)i)
                FAIL("ping-pong: reply %u to message %d\n", reply[0], i);
        } else {
            MPI_Recv(buf, (int)size, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (buf[0] != (unsigned char)i || buf[size - 1] != (unsigned char)i)
                FAIL("ping-pong: message %d of %zu bytes arrived wrong\n", i, size);
            memcpy(reply, buf, 8);
            MPI_Send(reply, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
        }
    }
    return MPI_Wtime() - t0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (ranks != 2)
        FAIL("run with two ranks, not %d\n", ranks);

    const size_t big = 1 << 20;
    unsigned char *buf = malloc(big);
    pingpong(rank, 8, 1000, buf); /* warm-up */
    int iters = 20000;
    double t = pingpong(rank, 8, iters, buf);
    if (rank == 0)
        printf("latency: 8 B %.2f us\n", t / iters / 2 * 1e6);
    pingpong(rank, big, 10, buf);
    iters = 200;
    t = pingpong(rank, big, iters, buf);
    if (rank == 0)
        printf("bandwidth: 1 MiB %.0f MB/s\n", (double)big * iters / t / 1e6);

    const int n = 64 * 1024;
    double *in = malloc(n * sizeof(double)), *out = malloc(n * sizeof(double));
    for (int i = 0; i < n; i++)
        in[i] = (double)((i % 1000) * (rank + 1));
    MPI_Allreduce(in, out, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); /* warm-up */
    iters = 50;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++)
        MPI_Allreduce(in, out, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    t = MPI_Wtime() - t0;
    for (int i = 0; i < n; i++)
        if (out[i] != (double)((i % 1000) * 3))
            FAIL("allreduce: element %d is %f, not %d\n", i, out[i], (i % 1000) * 3);
    if (rank == 0)
        printf("allreduce: 64 Ki doubles %.1f us, exact\n", t / iters * 1e6);

    int *window_memory;
    MPI_Win win;
    MPI_Win_allocate(n * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &window_memory, &win);
    for (int i = 0; i < n; i++)
        window_memory[i] = -1;
    int *mine = malloc(n * sizeof(int));
    for (int i = 0; i < n; i++)
        mine[i] = rank * 1000000 + i;
    MPI_Win_fence(0, win);
    MPI_Put(mine, n, MPI_INT, 1 - rank, 0, n, MPI_INT, win);
    MPI_Win_fence(0, win);
    for (int i = 0; i < n; i++)
        if (window_memory[i] != (1 - rank) * 1000000 + i)
            FAIL("put: element %d is %d\n", i, window_memory[i]);
    if (rank == 0)
        printf("put: 64 Ki ints into the peer's window, checked\n");
    MPI_Win_free(&win);
    MPI_Finalize();
    return 0;
}
