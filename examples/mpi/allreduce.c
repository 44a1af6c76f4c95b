/* The allreduce softrnic's in-network aggregation is measured against:
 * MPI_Allreduce (MPI_SUM) of int32 tensors over Open MPI's TCP transport,
 * repeated for a number of seconds. Rank 0 prints the goodput in the
 * units `softrnic agg worker` reports: tensor values x 32 bits per second.
 *
 *   mpicc -O2 -o allreduce allreduce.c
 *   mpirun -np 4 ./allreduce VALUES SECONDS
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long values = argc > 1 ? atol(argv[1]) : 65536;
    double seconds = argc > 2 ? atof(argv[2]) : 5.0;
    int *in = malloc(values * sizeof(int)), *out = malloc(values * sizeof(int));
    for (long i = 0; i < values; i++) in[i] = (int)((i * 31 + rank * 13) % 2001) - 1000;
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    long steps = 0;
    int more = 1;
    while (more) {
        MPI_Allreduce(in, out, (int)values, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        steps++;
        /* Rank 0's clock decides for all, so every rank runs as many steps. */
        more = MPI_Wtime() - start < seconds;
        MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    double elapsed = MPI_Wtime() - start;
    long bad = 0;
    for (long i = 0; i < values; i++) {
        long exact = 0;
        for (int r = 0; r < size; r++) exact += (int)((i * 31 + r * 13) % 2001) - 1000;
        bad += out[i] != exact;
    }
    if (rank == 0)
        printf("mpi allreduce: %d ranks, %ld steps of %ld values in %.2f s, %.3f Gb/s, %ld wrong\n", size, steps, values,
               elapsed, steps * values * 32.0 / elapsed / 1e9, bad);
    free(in);
    free(out);
    MPI_Finalize();
    return bad != 0;
}
