package selection

import "slices"

// heap keeps the best cap entries seen (all of them when cap is 0) as a
// max-heap on less, so the worst kept entry is at the root and a better
// newcomer replaces it in O(log cap).
type heap struct {
	cap   int
	items []entry
}

// full reports whether a newcomer must beat the worst kept entry, the
// root; an unbounded heap is never full.
func (h *heap) full() bool { return h.cap > 0 && len(h.items) >= h.cap }

// push keeps e; when full, only an e better than the root.
func (h *heap) push(e *entry) {
	if h.cap <= 0 {
		h.items = append(h.items, *e)
		return
	}
	if len(h.items) < h.cap {
		h.items = append(h.items, *e)
		h.up(len(h.items) - 1)
		return
	}
	h.items[0] = *e
	h.down(0)
}

func (h *heap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(&h.items[p], &h.items[i]) {
			return
		}
		h.items[p], h.items[i] = h.items[i], h.items[p]
		i = p
	}
}

func (h *heap) down(i int) {
	n := len(h.items)
	for {
		worst, l, r := i, 2*i+1, 2*i+2
		if l < n && less(&h.items[worst], &h.items[l]) {
			worst = l
		}
		if r < n && less(&h.items[worst], &h.items[r]) {
			worst = r
		}
		if worst == i {
			return
		}
		h.items[i], h.items[worst] = h.items[worst], h.items[i]
		i = worst
	}
}

// sorted returns the kept entries best first.
func (h *heap) sorted() []entry {
	slices.SortFunc(h.items, func(a, b entry) int {
		if less(&a, &b) {
			return -1
		}
		if less(&b, &a) {
			return 1
		}
		return 0
	})
	return h.items
}
