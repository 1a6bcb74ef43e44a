package selection

import (
	"cmp"
	"slices"
)

// rank indexes a pool's candidates by the load part of one sort key (the
// chain's keys after a leading volume-locality, e.g. build containers then
// active tasks), in buckets of equal keys, best first. SetLoad moves a
// candidate between buckets, so a one-target decision starts at the best
// bucket and stops at the first that holds an eligible candidate instead of
// walking every compatible target.
type rank struct {
	kinds   rankKey
	key     []uint64 // per candidate: the key it is filed under
	pos     []int32  // per candidate: its place in its bucket's members
	buckets map[uint64]*bucket
	order   []*bucket // non-empty buckets, best key first
}

// rankKey names a rank: up to two load kinds (build containers, active
// tasks), in chain order; kindNone ends it.
type rankKey [2]kind

type bucket struct {
	key     uint64
	members []int32
}

// loadKey packs the load kinds of l into one number ordered as the keys
// are: smaller is better, the first kind most significant.
func (k rankKey) loadKey(l *load) uint64 {
	var key uint64
	for _, kd := range k {
		var v int32
		switch kd {
		case kindBuild:
			v = l.build
		case kindTasks:
			v = l.tasks
		default:
			continue
		}
		key = key<<32 | uint64(uint32(v)^1<<31) // order-preserving for negatives
	}
	return key
}

func newRank(kinds rankKey, slots []slot) *rank {
	r := &rank{kinds: kinds, key: make([]uint64, len(slots)), pos: make([]int32, len(slots)),
		buckets: map[uint64]*bucket{}}
	for i := range slots {
		r.file(int32(i), kinds.loadKey(&slots[i].load))
	}
	return r
}

// file puts candidate i in the bucket of key.
func (r *rank) file(i int32, key uint64) {
	b, ok := r.buckets[key]
	if !ok {
		b = &bucket{key: key}
		r.buckets[key] = b
		at, _ := slices.BinarySearchFunc(r.order, key, func(b *bucket, k uint64) int { return cmp.Compare(b.key, k) })
		r.order = slices.Insert(r.order, at, b)
	}
	r.key[i], r.pos[i] = key, int32(len(b.members))
	b.members = append(b.members, i)
}

// move refiles candidate i after its load changed.
func (r *rank) move(i int32, l *load) {
	key := r.kinds.loadKey(l)
	if key == r.key[i] {
		return
	}
	b := r.buckets[r.key[i]]
	last := b.members[len(b.members)-1]
	b.members[r.pos[i]], r.pos[last] = last, r.pos[i]
	b.members = b.members[:len(b.members)-1]
	if len(b.members) == 0 {
		delete(r.buckets, b.key)
		r.order = slices.DeleteFunc(r.order, func(o *bucket) bool { return o == b })
	}
	r.file(i, key)
}

// rankedFrom is the smallest class a one-target decision looks up in a
// rank rather than walking: below it, or when the class is under a quarter
// of the pool (its members then thin out every bucket), a walk is as fast.
var rankedFrom = 256

// samples is how many random members of a bucket a decision tries before
// it walks the bucket. Each try is uniform over the bucket, so the first
// eligible one is uniform over the bucket's eligible members.
const samples = 16

// rankKeyOf returns the rank a one-target decision with keyKinds can use,
// and whether it can: a volume-locality key is only allowed first (the
// targets holding inputs are then decided apart from the rank).
func rankKeyOf(keyKinds []kind) (k rankKey, locality, ok bool) {
	if len(keyKinds) > 0 && keyKinds[0] == kindLocality {
		keyKinds, locality = keyKinds[1:], true
	}
	if len(keyKinds) > len(k) {
		return k, false, false
	}
	for i, kd := range keyKinds {
		if kd != kindBuild && kd != kindTasks {
			return k, false, false
		}
		k[i] = kd
	}
	return k, locality, true
}

// rank returns the pool's rank for k, making it on first use.
func (p *Pool) rank(k rankKey) *rank {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.ranks[k]
	if !ok {
		r = newRank(k, p.slots)
		p.ranks[k] = r
	}
	return r
}

// eligible: in the class and at no limit.
func (p *Pool) eligible(pl *placer, c *class, i int32) bool {
	return c.has(i) && !pl.refuses(&p.slots[i].load)
}

// pickRanked is a one-target decision through a rank: the targets holding
// the step's inputs first when the chain starts with volume-locality (they
// beat every other target unless refused), then the best bucket holding an
// eligible target. It returns -1 when every compatible target is refused.
func (p *Pool) pickRanked(pl *placer, c *class, r *rank, locality bool) int {
	if locality {
		var buf [8]int32
		holders := buf[:0]
		for _, a := range pl.in.list() {
			if c.has(int32(a.i)) {
				holders = append(holders, int32(a.i))
			}
		}
		if p.offer(pl, holders); len(pl.ties) > 0 {
			return pl.ties[pl.draw()%uint64(len(pl.ties))]
		}
	}
	for _, b := range r.order {
		if i := p.pickIn(pl, c, b.members); i >= 0 {
			return i
		}
	}
	return -1
}

// pickIn picks an eligible member of one bucket uniformly, or -1.
func (p *Pool) pickIn(pl *placer, c *class, members []int32) int {
	for range min(samples, len(members)) {
		if i := members[pl.draw()%uint64(len(members))]; p.eligible(pl, c, i) {
			return int(i)
		}
	}
	pl.ties = pl.ties[:0]
	for _, i := range members {
		if p.eligible(pl, c, i) {
			pl.ties = append(pl.ties, int(i))
		}
	}
	if len(pl.ties) == 0 {
		return -1
	}
	return pl.ties[pl.draw()%uint64(len(pl.ties))]
}
