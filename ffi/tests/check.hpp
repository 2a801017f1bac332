// Assertion helper shared by the C++ tests (the C tests have check.h): counts passes and
// failures in `passed` / `failed` and prints each failure with its line.
#ifndef KVFENCE_TEST_CHECK_HPP
#define KVFENCE_TEST_CHECK_HPP

#include <cstdio>

static int passed, failed;
#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (cond) {                                                                        \
            passed++;                                                                      \
        } else {                                                                           \
            failed++;                                                                      \
            std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
        }                                                                                  \
    } while (0)

#endif
