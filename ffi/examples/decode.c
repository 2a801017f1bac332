/* The decode side of one request, in C: open, abort, ACKs, drain. (docs/API.md, "From C and C++";
 * built and run by ffi/ci.sh through pkg-config and through CMake's find_package.) */
#include <kvfence.h>
#include <stdio.h>

int main(void) {
    kvfence_config cfg = kvfence_config_gate(4096); /* the engine owns its pages */
    cfg.release_queue = 1;                          /* releases go to the scheduler */
    kvfence_table *t;
    if (kvfence_table_new(&cfg, &t) != KVFENCE_OK) return 1;

    uint32_t ranks[] = {0, 1, 2, 3}, pages[16];     /* prefill ranks, KV pages */
    for (int i = 0; i < 16; i++) pages[i] = 100 + i;
    kvfence_handle h;                               /* send it with the pages to the ranks */
    kvfence_status s = kvfence_open_gate(t, ranks, 4, /*token=*/17, pages, 16, &h);
    if (s != KVFENCE_OK) { printf("open: %s\n", kvfence_status_str(s)); return 1; }

    uint32_t fanout[KVFENCE_MAX_WRITERS]; size_t nfan; kvfence_release r;
    kvfence_abort(t, h, fanout, KVFENCE_MAX_WRITERS, &nfan, &r);  /* client left */
    kvfence_quiesced q;                             /* ACK thread: each rank drained */
    for (size_t i = 0; i < nfan; i++) kvfence_quiesce(t, h, fanout[i], &q, &r);
    s = kvfence_quiesce(t, h, 2, &q, &r);           /* a late duplicate changes nothing */
    printf("late ACK: %s\n", kvfence_status_str(s));

    kvfence_release out[8]; size_t n;               /* scheduler loop: drain, then free */
    kvfence_drain_released(t, out, 8, &n);
    for (size_t i = 0; i < n; i++)
        printf("free slot %llu and %zu pages\n", (unsigned long long)out[i].token, out[i].pages_len);
    kvfence_releases_free(out, n);
    kvfence_table_free(t);
    return n == 1 ? 0 : 1;
}
