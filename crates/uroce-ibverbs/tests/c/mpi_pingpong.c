/* An MPI ping-pong of two ranks (tests/mpi.rs): rank 0 sends messages of
 * 8 B, 4 KiB and 1 MiB, each filled with a pattern of its own size and
 * iteration; rank 1 checks every byte and sends the message back; rank 0
 * checks every byte of the echo. Prints "mpi pingpong ok" on rank 0 when all
 * matched; a wrong byte aborts the job with code 3 (a wrong length with 2),
 * after printing the size, iteration and offset.
 * Usage: mpi_pingpong [corrupt]: with "corrupt", rank 1 flips one byte of
 * the 4 KiB echo before sending it (to see that the check catches it). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITERS 5

static unsigned char pattern(size_t size, int iter, size_t i)
{
    /* Differs between sizes and iterations, and along the message. */
    return (unsigned char)(i * 131 + (i >> 8) * 7 + size * 17 + iter * 29 + 1);
}

static void check(const unsigned char *buf, size_t size, int iter, int rank, const char *what)
{
    for (size_t i = 0; i < size; i++) {
        if (buf[i] != pattern(size, iter, i)) {
            fprintf(stderr, "rank %d: %s of %zu B, iteration %d: byte %zu is 0x%02x, not 0x%02x\n", rank, what,
                    size, iter, i, buf[i], pattern(size, iter, i));
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
}

/* Receives `size` bytes from rank `from` into a zeroed `buf` and checks
 * their length and every byte (exit 2 for a length, 3 for a byte). */
static void recv_checked(unsigned char *buf, size_t size, int from, int tag, int iter, int rank, const char *what)
{
    memset(buf, 0, size);
    MPI_Status st;
    MPI_Recv(buf, (int)size, MPI_BYTE, from, tag, MPI_COMM_WORLD, &st);
    int got;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if ((size_t)got != size) {
        fprintf(stderr, "rank %d: %s of %zu B is %d B\n", rank, what, size, got);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    check(buf, size, iter, rank, what);
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {8, 4096, 1 << 20};
    int rank, nranks;
    int corrupt = argc > 1 && strcmp(argv[1], "corrupt") == 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2) {
        fprintf(stderr, "needs exactly 2 ranks, has %d\n", nranks);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    unsigned char *buf = malloc(1 << 20);
    if (!buf)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t size = sizes[s];
        for (int iter = 0; iter < ITERS; iter++) {
            int tag = (int)(s * 100 + iter);
            if (rank == 0) {
                for (size_t i = 0; i < size; i++)
                    buf[i] = pattern(size, iter, i);
                MPI_Send(buf, (int)size, MPI_BYTE, 1, tag, MPI_COMM_WORLD);
                recv_checked(buf, size, 1, tag, iter, rank, "echo");
            } else {
                recv_checked(buf, size, 0, tag, iter, rank, "message");
                if (corrupt && size == 4096 && iter == ITERS - 1)
                    buf[size / 2] ^= 0x40;
                MPI_Send(buf, (int)size, MPI_BYTE, 0, tag, MPI_COMM_WORLD);
            }
        }
    }
    free(buf);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("mpi pingpong ok\n");
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
