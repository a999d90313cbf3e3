/* The C clients' wait for one completion: polls `cq`, busy at first, then
 * sleeping 10 us between polls, for at most about 50 s; fails the test
 * (check.h) on a poll error or if none comes. */
#ifndef UROCE_TEST_WAIT_H
#define UROCE_TEST_WAIT_H
#include <unistd.h>
#include <infiniband/verbs.h>
#include "check.h"

static inline struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (long i = 0; i < 5000000; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "poll_cq %d", n);
		if (n == 1)
			return wc;
		if (i > 1000)
			usleep(10);
	}
	CHECK(0, "no completion");
	return wc;
}

#endif
