/*
 * MPI_Allreduce(MPI_SUM, MPI_FLOAT) timing: the all-reduce baseline for Syncopate.
 *
 * Usage: mpi_allreduce [--min-time S] [--min-iters N] [--back-to-back] [SIZE ...]
 *   SIZE  message size in bytes of float32 data, a multiple of 4; a suffix K, M or G
 *         (KiB, MiB, GiB) is accepted. Default: 4K 64K 1M 16M 100M.
 *   --min-time S   aim for at least S seconds of timed iterations per size (default 1.0)
 *   --min-iters N  at least N timed iterations per size (default 5)
 *   --back-to-back time rank 0's calls one after the other, with no barrier, as
 *                  `syncopate bench-comm` does (default: a barrier before each call)
 *
 * For each size: fills the send buffer, runs warm-up all-reduces (10, or 2 from 16 MiB up;
 * the sum is checked once), estimates the time of one call from the warm-up's second half,
 * then times max(min-iters, min-time / estimate) calls (at most 10000), each started right
 * after an MPI_Barrier. An iteration's time is the slowest rank's. Every call reduces in
 * place (MPI_IN_PLACE) a buffer just filled from the send buffer, outside the clock: the
 * method of the Gloo reference (torch's in-place all_reduce after copy_) and of
 * `syncopate bench-comm` (the input written into the strategy's buffer first). Prints to stdout, CSV, one line per size after a header line:
 *   size_bytes,ranks,median_s,busbw_GBps
 * where busbw_GBps = 2*(ranks-1)/ranks * size_bytes / median_s / 1e9 (the nccl-tests
 * "bus bandwidth" of an all-reduce: the bytes each rank sends and receives in a ring).
 * Diagnostics (iteration counts) go to stderr as '# ' lines.
 */
#include <mpi.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 64
#define MAX_ITERS 10000

/* Fills `recv` from `send`, then sums it in place across the ranks. */
static void reduce_in_place(const float *send, float *recv, int count) {
    memcpy(recv, send, sizeof(float) * (size_t)count);
    MPI_Allreduce(MPI_IN_PLACE, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Parses "4096", "4K", "64k", "1M", "100M", "1G". Returns 0 on error. */
static long long parse_size(const char *s) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || v <= 0) return 0;
    long long mult = 1;
    if (*end == 'K' || *end == 'k') { mult = 1LL << 10; end++; }
    else if (*end == 'M' || *end == 'm') { mult = 1LL << 20; end++; }
    else if (*end == 'G' || *end == 'g') { mult = 1LL << 30; end++; }
    if (*end == 'i' && end[1] == 'B') end += 2;      /* also "KiB", "MiB", "GiB" */
    else if (*end == 'B' && mult > 1) end += 1;      /* and "KB", "MB" */
    if (*end != '\0') return 0;
    return v * mult;
}

static void usage_error(int rank, const char *msg, const char *arg) {
    if (rank == 0) {
        fprintf(stderr, "mpi_allreduce: error: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
        fprintf(stderr, "usage: mpi_allreduce [--min-time S] [--min-iters N] [--back-to-back] [SIZE[K|M|G] ...]\n");
    }
    MPI_Finalize();
    exit(2);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);

    long long sizes[MAX_SIZES];
    int nsizes = 0;
    double min_time = 1.0;
    int min_iters = 5;
    int back_to_back = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--min-time") == 0 && i + 1 < argc) {
            min_time = atof(argv[++i]);
            if (!(min_time >= 0.0)) usage_error(rank, "bad --min-time", argv[i]);
        } else if (strcmp(argv[i], "--min-iters") == 0 && i + 1 < argc) {
            min_iters = atoi(argv[++i]);
            if (min_iters < 1 || min_iters > MAX_ITERS) usage_error(rank, "bad --min-iters", argv[i]);
        } else if (strcmp(argv[i], "--back-to-back") == 0) {
            back_to_back = 1;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            if (rank == 0)
                printf("usage: mpi_allreduce [--min-time S] [--min-iters N] [--back-to-back] [SIZE[K|M|G] ...]\n");
            MPI_Finalize();
            return 0;
        } else {
            long long s = parse_size(argv[i]);
            if (s == 0) usage_error(rank, "bad size", argv[i]);
            if (s % 4 != 0) usage_error(rank, "size is not a multiple of 4 bytes (float32)", argv[i]);
            if (s / 4 > 0x7fffffffLL) usage_error(rank, "size too large for one MPI count", argv[i]);
            if (nsizes == MAX_SIZES) usage_error(rank, "too many sizes", argv[i]);
            sizes[nsizes++] = s;
        }
    }
    if (nsizes == 0) {
        const long long defaults[] = {4LL << 10, 64LL << 10, 1LL << 20, 16LL << 20, 100LL << 20};
        for (int i = 0; i < 5; i++) sizes[nsizes++] = defaults[i];
    }

    if (rank == 0) {
        printf("size_bytes,ranks,median_s,busbw_GBps\n");
        fflush(stdout);
    }
    double *times = malloc(sizeof(double) * MAX_ITERS);
    double *tmax = malloc(sizeof(double) * MAX_ITERS);
    if (!times || !tmax) {
        fprintf(stderr, "mpi_allreduce: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    int failed = 0;
    for (int si = 0; si < nsizes; si++) {
        const long long bytes = sizes[si];
        const int count = (int)(bytes / 4);
        float *send = malloc((size_t)bytes);
        float *recv = malloc((size_t)bytes);
        if (!send || !recv) {
            fprintf(stderr, "mpi_allreduce: rank %d: cannot allocate 2 x %lld bytes\n", rank, bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        /* Small integers keep the float sums exact, so the check below is exact. */
        for (int i = 0; i < count; i++) send[i] = (float)(rank + 1 + (i % 7));

        /* Warm-up: connections, buffers and caches; the first result is checked. */
        /* The second half of the warm-up estimates the time of one call. */
        const int warm = bytes >= (16LL << 20) ? 2 : 10;
        for (int w = 0; w < warm / 2; w++)
            reduce_in_place(send, recv, count);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int w = warm / 2; w < warm; w++)
            reduce_in_place(send, recv, count);
        double est = (MPI_Wtime() - t0) / (warm - warm / 2);
        long long bad = 0;
        for (int i = 0; i < count; i++) {
            float want = (float)(ranks * (ranks + 1) / 2 + ranks * (i % 7));
            if (recv[i] != want) bad++;
        }
        long long bad_all = 0;
        MPI_Allreduce(&bad, &bad_all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (bad_all != 0) {
            if (rank == 0)
                fprintf(stderr, "mpi_allreduce: error: %lld wrong sums at size %lld\n", bad_all, bytes);
            failed = 1;
        }

        /* Rank 0 decides the iteration count so every rank runs the same number. */
        int iters = min_iters;
        if (rank == 0 && est > 0.0) {
            double want = min_time / est;
            if (want > iters) iters = want > MAX_ITERS ? MAX_ITERS : (int)want + 1;
        }
        MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);

        for (int it = 0; it < iters; it++) {
            memcpy(recv, send, (size_t)bytes);
            if (!back_to_back) MPI_Barrier(MPI_COMM_WORLD);
            double a = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            times[it] = MPI_Wtime() - a;
        }
        /* Barrier-timed: a call's time is the slowest rank's; back to back: rank 0's own. */
        if (back_to_back)
            memcpy(tmax, times, sizeof(double) * (size_t)iters);
        else
            MPI_Reduce(times, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double med = median(tmax, iters);
            double busbw = med > 0.0 ? 2.0 * (ranks - 1) / ranks * (double)bytes / med / 1e9 : 0.0;
            printf("%lld,%d,%.9f,%.3f\n", bytes, ranks, med, busbw);
            fflush(stdout);
            fprintf(stderr, "# size %lld bytes: %d timed iterations after %d warm-up\n",
                    bytes, iters, warm);
        }
        free(send);
        free(recv);
    }
    free(times);
    free(tmax);
    MPI_Finalize();
    return failed ? 1 : 0;
}
