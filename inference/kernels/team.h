/* A thread's share of a loop in its OpenMP team, for the kernels that hand out one contiguous
 * range a thread (q8_matmul's row blocks, the attention's tasks) instead of OpenMP's own
 * schedule, so that a thread knows its range before the loop: the weights it streams first
 * are fetched before its rows are prepared, the next task's keys while it computes one. */
#ifndef CHATUI_TEAM_H
#define CHATUI_TEAM_H

#ifdef _OPENMP
#include <omp.h>
#endif

/* [*lo, *hi): this thread's share of n items, the team's shares in thread order and of equal
 * size give or take one (every item once; all of them outside a parallel region). */
static inline void team_range(int n, int *lo, int *hi) {
#ifdef _OPENMP
    int team = omp_get_num_threads(), me = omp_get_thread_num();
#else
    int team = 1, me = 0;
#endif
    *lo = (int)((long)n * me / team);
    *hi = (int)((long)n * (me + 1) / team);
}

#endif
