/* The Open MPI side of `cargo xtask bench-net` (and of BENCHMARKS.md's loopback runs): times
 * MPI_Bcast / MPI_Allgather the way `ringcast bench` times its collectives: per size one
 * untimed run, WARMUP warm-up runs, ITERS timed runs, each after a barrier; an iteration's
 * latency is the slowest rank's (MPI_Reduce MAX); avg/min/max over iterations.
 * Build: mpicc -O2 -o mpi_bench mpi_bench.c */
/* usage: mpi_bench [--huge-pages] bcast|allgather|allgather-in-place WARMUP ITERS SIZE...
 * (allgather-in-place: MPI_IN_PLACE, each rank's block already in the receive buffer;
 * --huge-pages: the buffers on 2 MiB transparent huge pages, madvise(MADV_HUGEPAGE) before
 * they are touched, as `ringcast bench --huge-pages` has its own) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#define HUGE (2L << 20)
static int huge = 0;
/* n bytes, 2 MiB-aligned and advised under --huge-pages. */
static char *buffer(long n) {
    if (!huge) return malloc(n);
    void *p = NULL;
    long len = (n + HUGE - 1) / HUGE * HUGE;
    if (posix_memalign(&p, HUGE, len ? len : HUGE) != 0) return NULL;
    if (len) madvise(p, len, MADV_HUGEPAGE);
    return p;
}
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (argc > 1 && strcmp(argv[1], "--huge-pages") == 0) {
        huge = 1;
        argv++;
        argc--;
    }
    int me, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    int bcast = strcmp(argv[1], "bcast") == 0, warmup = atoi(argv[2]), iters = atoi(argv[3]);
    int in_place = strcmp(argv[1], "allgather-in-place") == 0;
    double *t = malloc(sizeof(double) * iters), *tmax = malloc(sizeof(double) * iters);
    if (me == 0)
        printf("%-10s%18s%18s%18s%12s%14s%14s\n", "# Size", "Avg Latency(us)", "Min Latency(us)",
               "Max Latency(us)", "Iterations", "algbw(GB/s)", "busbw(GB/s)");
    for (int a = 4; a < argc; a++) {
        long n = atol(argv[a]);
        char *send = buffer(n), *recv = buffer(bcast ? 1 : n * p);
        memset(send, me, n);
        if (!bcast) memset(recv, 0, n * p);
        if (in_place) memset(recv + (long)me * n, me, n);
        for (int i = -1 - warmup; i < iters; i++) {   /* 1 untimed + warmup, then timed */
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (bcast) MPI_Bcast(send, n, MPI_BYTE, 0, MPI_COMM_WORLD);
            else if (in_place)
                MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, MPI_BYTE, MPI_COMM_WORLD);
            else MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, MPI_COMM_WORLD);
            if (i >= 0) t[i] = MPI_Wtime() - t0;
        }
        MPI_Reduce(t, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (me == 0) {
            double sum = 0, mn = 1e30, mx = 0;
            for (int i = 0; i < iters; i++) {
                sum += tmax[i];
                if (tmax[i] < mn) mn = tmax[i];
                if (tmax[i] > mx) mx = tmax[i];
            }
            double avg = sum / iters, total = bcast ? n : (double)n * p;
            double algbw = total / avg / 1e9, busbw = bcast ? algbw : algbw * (p - 1) / p;
            printf("%-10ld%18.2f%18.2f%18.2f%12d%14.2f%14.2f\n", n, avg * 1e6, mn * 1e6,
                   mx * 1e6, iters, algbw, busbw);
            fflush(stdout);
        }
        free(send);
        free(recv);
    }
    MPI_Finalize();
    return 0;
}
