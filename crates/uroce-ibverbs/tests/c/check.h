/* The C clients' assertion: on failure, print where and why, and exit 1. */
#ifndef UROCE_TEST_CHECK_H
#define UROCE_TEST_CHECK_H
#include <stdio.h>
#include <stdlib.h>

#define CHECK(c, ...)                                                     \
	do {                                                              \
		if (!(c)) {                                               \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                     \
			fprintf(stderr, "\n");                            \
			exit(1);                                          \
		}                                                         \
	} while (0)

#endif
