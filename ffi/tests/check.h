/* Tiny assertion helpers shared by the C tests: count passes and failures, print each
 * failure with its line, and end with "NAME: N passed, M failed". */
#ifndef KVFENCE_TEST_CHECK_H
#define KVFENCE_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "kvfence.h"

static int check_passed, check_failed;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (cond) {                                                                     \
            check_passed++;                                                             \
        } else {                                                                        \
            check_failed++;                                                             \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);             \
        }                                                                               \
    } while (0)

/* `call` must return exactly `want`. */
#define EXPECT(call, want)                                                              \
    do {                                                                                \
        kvfence_status got_ = (call);                                                   \
        if (got_ == (kvfence_status)(want)) {                                           \
            check_passed++;                                                             \
        } else {                                                                        \
            char msg_[256];                                                             \
            kvfence_last_error(msg_, sizeof msg_, NULL);                                \
            check_failed++;                                                             \
            fprintf(stderr, "FAIL %s:%d: %s -> %u (%s: %s), want %s\n", __FILE__,       \
                    __LINE__, #call, (unsigned)got_, kvfence_status_str(got_), msg_,    \
                    #want);                                                             \
        }                                                                               \
    } while (0)

#define OK(call) EXPECT(call, KVFENCE_OK)

static int check_report(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    return check_failed == 0 ? 0 : 1;
}

#endif
