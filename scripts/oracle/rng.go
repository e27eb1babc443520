package main

// rng is splitmix64: a fixed, documented sequence for a seed, so a seed replays the same
// world and cases whatever Go version builds this program.
type rng struct{ state uint64 }

func newRNG(seed int64, stream uint64) *rng {
	r := &rng{state: uint64(seed)*0x9E3779B97F4A7C15 ^ stream*0xD1B54A32D192ED03}
	r.next()
	return r
}

func (r *rng) next() uint64 {
	r.state += 0x9E3779B97F4A7C15
	z := r.state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// intn is a number in [0, n).
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

// chance is true with probability pct/100.
func (r *rng) chance(pct int) bool { return r.intn(100) < pct }

func pick[T any](r *rng, xs []T) T { return xs[r.intn(len(xs))] }

// some is a non-empty random subset of xs (order kept), at most max elements.
func some[T any](r *rng, xs []T, max int) []T {
	n := 1 + r.intn(max)
	idx := map[int]bool{}
	for len(idx) < n && len(idx) < len(xs) {
		idx[r.intn(len(xs))] = true
	}
	var out []T
	for i, x := range xs {
		if idx[i] {
			out = append(out, x)
		}
	}
	return out
}
