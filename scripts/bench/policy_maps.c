// SPDX-License-Identifier: Apache-2.0
/*
 * Measures the map operations behind the policy-map design choice (docs/DATAPATH.md):
 *   - HASH_OF_MAPS: creating an inner map, inserting a NEW key into the outer map (a new endpoint),
 *     replacing an existing key (a whole-policy swap), deleting a key;
 *   - one global LPM_TRIE keyed by endpoint: inserting and deleting one entry while the trie
 *     already holds the entries of many endpoints.
 * Prints the median and p90 of each in microseconds. Run by scripts/bench-policy-maps (root).
 */
#include <bpf/bpf.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The datapath's own key layout and prefix lengths, so the benchmark measures what it ships. */
#include "weft_maps.h"

#define N 200

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void report(const char *what, double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp);
	printf("%-52s median %9.1f us   p90 %9.1f us   (n=%d)\n", what, v[n / 2], v[n * 9 / 10], n);
}

static int inner_map(void)
{
	int fd = bpf_map_create(BPF_MAP_TYPE_HASH, "inner", 12, 4, 16384, NULL);

	if (fd < 0) {
		perror("bpf_map_create inner");
		exit(1);
	}
	return fd;
}

int main(void)
{
	static double t[N];
	static int inners[N];
	LIBBPF_OPTS(bpf_map_create_opts, outer_opts);
	LIBBPF_OPTS(bpf_map_create_opts, lpm_opts, .map_flags = BPF_F_NO_PREALLOC);

	/* HASH_OF_MAPS */
	for (int i = 0; i < N; i++) {
		double s = now_us();

		inners[i] = inner_map();
		t[i] = now_us() - s;
	}
	report("HASH_OF_MAPS: create inner HASH (16K entries)", t, N);

	outer_opts.inner_map_fd = inners[0];
	int outer = bpf_map_create(BPF_MAP_TYPE_HASH_OF_MAPS, "outer", 4, 4, 65536, &outer_opts);

	if (outer < 0) {
		perror("bpf_map_create outer");
		return 1;
	}
	for (int i = 0; i < N; i++) {
		__u32 k = i;
		double s = now_us();

		if (bpf_map_update_elem(outer, &k, &inners[i], BPF_NOEXIST)) {
			perror("outer insert");
			return 1;
		}
		t[i] = now_us() - s;
	}
	report("HASH_OF_MAPS: insert NEW key into outer", t, N);
	for (int i = 0; i < N; i++) {
		__u32 k = i;
		int fd = inners[(i + 1) % N];
		double s = now_us();

		bpf_map_update_elem(outer, &k, &fd, BPF_EXIST);
		t[i] = now_us() - s;
	}
	report("HASH_OF_MAPS: replace existing key (policy swap)", t, N);
	for (int i = 0; i < N; i++) {
		__u32 k = i;
		double s = now_us();

		bpf_map_delete_elem(outer, &k);
		t[i] = now_us() - s;
	}
	report("HASH_OF_MAPS: delete key", t, N);
	for (int i = 0; i < N; i++)
		close(inners[i]);
	close(outer);

	/* Global LPM trie, pre-filled with 250 endpoints x 1000 entries. */
	int lpm = bpf_map_create(BPF_MAP_TYPE_LPM_TRIE, "policy", sizeof(struct policy_key), 4,
				 1 << 20, &lpm_opts);

	if (lpm < 0) {
		perror("bpf_map_create lpm");
		return 1;
	}
	__u32 verdict = 1;

	for (__u32 ep = 1; ep <= 250; ep++)
		for (__u32 i = 0; i < 1000; i++) {
			struct policy_key k = { .prefixlen = WEFT_POLICY_FULL_PREFIX, .endpoint_id = ep, .identity = 256 + i,
						.direction = i & 1, .proto = 6, .dport = htons(80 + i % 7) };
			bpf_map_update_elem(lpm, &k, &verdict, BPF_ANY);
		}
	for (int i = 0; i < N; i++) {
		struct policy_key k = { .prefixlen = WEFT_POLICY_FULL_PREFIX - 4, .endpoint_id = 1000 + i, .identity = 300,
					.proto = 6, .dport = htons(8080) };
		double s = now_us();

		bpf_map_update_elem(lpm, &k, &verdict, BPF_ANY);
		t[i] = now_us() - s;
	}
	report("LPM_TRIE (250K entries): insert one entry", t, N);
	for (int i = 0; i < N; i++) {
		struct policy_key k = { .prefixlen = WEFT_POLICY_FULL_PREFIX - 4, .endpoint_id = 1000 + i, .identity = 300,
					.proto = 6, .dport = htons(8080) };
		double s = now_us();

		bpf_map_delete_elem(lpm, &k);
		t[i] = now_us() - s;
	}
	report("LPM_TRIE (250K entries): delete one entry", t, N);
	double s = now_us();

	for (__u32 i = 0; i < 1000; i++) {
		struct policy_key k = { .prefixlen = WEFT_POLICY_FULL_PREFIX, .endpoint_id = 5000, .identity = 256 + i,
					.proto = 6, .dport = htons(80) };
		bpf_map_update_elem(lpm, &k, &verdict, BPF_ANY);
	}
	t[0] = now_us() - s;
	printf("%-52s total  %9.1f us\n", "LPM_TRIE: 1000-entry policy for a new endpoint", t[0]);

	/* The same 1000 entries for another endpoint in one BPF_MAP_UPDATE_BATCH (the kernel's
	 * generic batch: one update per element, one syscall for all), then deleted in one batch. */
	static struct policy_key keys[1000];
	static __u32 values[1000];

	for (__u32 i = 0; i < 1000; i++) {
		keys[i] = (struct policy_key){ .prefixlen = WEFT_POLICY_FULL_PREFIX, .endpoint_id = 5001,
					       .identity = 256 + i, .proto = 6, .dport = htons(80) };
		values[i] = verdict;
	}
	__u32 count = 1000;

	s = now_us();
	if (bpf_map_update_batch(lpm, keys, values, &count, NULL)) {
		perror("bpf_map_update_batch");
		return 1;
	}
	t[0] = now_us() - s;
	printf("%-52s total  %9.1f us (%u entries)\n", "LPM_TRIE: same, one update batch", t[0], count);
	count = 1000;
	s = now_us();
	if (bpf_map_delete_batch(lpm, keys, &count, NULL)) {
		perror("bpf_map_delete_batch");
		return 1;
	}
	t[0] = now_us() - s;
	printf("%-52s total  %9.1f us (%u entries)\n", "LPM_TRIE: delete them, one delete batch", t[0], count);
	s = now_us();
	for (__u32 i = 0; i < 1000; i++) {
		struct policy_key k = { .prefixlen = WEFT_POLICY_FULL_PREFIX, .endpoint_id = 5000, .identity = 256 + i,
					.proto = 6, .dport = htons(80) };
		bpf_map_delete_elem(lpm, &k);
	}
	t[0] = now_us() - s;
	printf("%-52s total  %9.1f us\n", "LPM_TRIE: delete the first endpoint's, one by one", t[0]);
	close(lpm);
	return 0;
}
