/* The C side of the boundary benchmark (ffi/bench/run.sh): one lifecycle through the C ABI,
 * the same one bench/lifecycle.rs runs natively in Rust:
 *   kvfence_open_gate (8 writer ranks, 16 pages), 2 token transfers begun and completed,
 *   kvfence_abort (fan-out of 8), 8 kvfence_quiesce (the last queues the release),
 *   kvfence_drain_released, kvfence_release_free.
 * Usage: lifecycle SAMPLES ITERS; prints one line per sample: mean ns (of the thread's CPU
 * time) per lifecycle. */
#define _POSIX_C_SOURCE 200809L
#include <kvfence.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The thread's CPU time, not the wall clock: on the shared 2-core box a sample is otherwise
 * inflated by whatever time the scheduler gives other jobs (bench/lifecycle.rs reads the
 * same clock). */
static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int lifecycle(kvfence_table *t, uint64_t i, const uint32_t *writers,
                     const uint32_t *pages) {
    kvfence_handle h;
    kvfence_token a, b;
    kvfence_release r;
    if (kvfence_open_gate(t, writers, 8, i, pages, 16, &h) != KVFENCE_OK) return 0;
    if (kvfence_begin(t, h, 0, &a) != KVFENCE_OK) return 0;
    if (kvfence_begin(t, h, 1, &b) != KVFENCE_OK) return 0;
    if (kvfence_end(t, a, KVFENCE_COMPLETED, &r) != KVFENCE_OK) return 0;
    if (kvfence_end(t, b, KVFENCE_COMPLETED, &r) != KVFENCE_OK) return 0;
    uint32_t fan[KVFENCE_MAX_WRITERS];
    size_t nf;
    if (kvfence_abort(t, h, fan, KVFENCE_MAX_WRITERS, &nf, &r) != KVFENCE_OK || nf != 8)
        return 0;
    /* The ACKs answer the ABORTs sent to the fan-out list (bench/lifecycle.rs does the same
     * with `Aborted::fanout`). */
    kvfence_quiesced q;
    for (size_t k = 0; k < nf; k++)
        if (kvfence_quiesce(t, h, fan[k], &q, &r) != KVFENCE_OK) return 0;
    kvfence_release out[4];
    size_t n;
    if (kvfence_drain_released(t, out, 4, &n) != KVFENCE_OK || n != 1) return 0;
    kvfence_release_free(&out[0]);
    return 1;
}

int main(int argc, char **argv) {
    long samples = argc > 1 ? atol(argv[1]) : 7, iters = argc > 2 ? atol(argv[2]) : 200000;
    kvfence_config c = kvfence_config_gate(1024);
    c.release_queue = 1;
    kvfence_table *t;
    if (kvfence_table_new(&c, &t) != KVFENCE_OK) return 1;
    uint32_t writers[8], pages[16];
    for (uint32_t k = 0; k < 8; k++) writers[k] = k;
    for (uint32_t k = 0; k < 16; k++) pages[k] = 100 + k;
    for (long i = 0; i < iters / 10; i++)
        if (!lifecycle(t, (uint64_t)i, writers, pages)) return 2;
    for (long s = 0; s < samples; s++) {
        double start = now_ns();
        for (long i = 0; i < iters; i++)
            if (!lifecycle(t, (uint64_t)i, writers, pages)) return 2;
        printf("%.1f\n", (now_ns() - start) / (double)iters);
    }
    kvfence_table_free(t);
    return 0;
}
