package main

import "testing"

// TestSmoke runs the benchmark small: every replayed store operation must succeed (states,
// leases and job transitions as stack.apply has them) and coalescing must keep an apply's job
// writes below its progress calls. No timing is asserted.
func TestSmoke(t *testing.T) {
	res, err := runAll(t.Context(), t.TempDir(), []int{10, 50}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for n, f := range res {
		if f.job <= 0 || f.transition <= 0 || f.apply <= 0 || f.jobFilter <= 0 {
			t.Fatalf("%d jobs: missing figures %+v", n, f)
		}
		// create, start, finish, 4 log lines and at least the first and last progress: 9; the
		// 27 progress calls uncoalesced would make 34.
		if f.applyWrites < 9 || f.applyWrites >= 34 {
			t.Fatalf("%d jobs: %d job writes per apply", n, f.applyWrites)
		}
	}
}
