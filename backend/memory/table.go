package memorybackend

// table maps a shard's identifiers to their entries. It is an open
// addressing hash table, probed linearly, over a power-of-two array of
// slots, keyed by the identifier's hash that also picked the shard: an
// identifier is hashed once per request, where a Go map would hash it again.
// The zero table is empty and ready.
type table struct {
	slots []tableSlot
	n     int // slots in use
}

// tableSlot is one slot: ie is nil when it is free.
type tableSlot struct {
	hash uint64
	ie   *idEntry
}

const (
	// minTableSize is the size of a table's first array of slots.
	minTableSize = 8
	// shardBits are the hash's low bits, which pick the shard; the table
	// places an identifier with the bits above them.
	shardBits = 6
)

// home returns the slot a hash is placed at when nothing is in the way.
func (t *table) home(h uint64) int { return int(h>>shardBits) & (len(t.slots) - 1) }

// find returns the index of the slot holding id, whose hash is h, or -1.
func (t *table) find(h uint64, id string) int {
	if t.n == 0 {
		return -1
	}
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.ie == nil {
			return -1
		}
		if s.hash == h && s.ie.id == id {
			return i
		}
	}
}

// get returns the entry of id, whose hash is h, or nil.
func (t *table) get(h uint64, id string) *idEntry {
	if i := t.find(h, id); i >= 0 {
		return t.slots[i].ie
	}
	return nil
}

// put adds ie, whose identifier the table does not hold and hashes to h.
// It keeps at least a quarter of the slots free, so that probes stay short.
func (t *table) put(h uint64, ie *idEntry) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(max(minTableSize, len(t.slots)*2))
	}
	t.place(h, ie)
	t.n++
}

// place stores ie at the first free slot from its hash's home.
func (t *table) place(h uint64, ie *idEntry) {
	mask := len(t.slots) - 1
	i := t.home(h)
	for t.slots[i].ie != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = tableSlot{hash: h, ie: ie}
}

// resize moves every entry to a new array of size slots, a power of two
// with room for them all; size 0 (for an empty table) drops the array.
func (t *table) resize(size int) {
	old := t.slots
	t.slots = nil
	if size == 0 {
		return
	}
	t.slots = make([]tableSlot, size)
	for _, s := range old {
		if s.ie != nil {
			t.place(s.hash, s.ie)
		}
	}
}

// fit shrinks the array to the smallest that holds the entries with a
// quarter of it free: the memory of a burst of identifiers that have gone
// is given back.
func (t *table) fit() {
	size := 0
	if t.n > 0 {
		size = minTableSize
		for t.n*4 > size*3 {
			size *= 2
		}
	}
	if size != len(t.slots) {
		t.resize(size)
	}
}

// deleteAt frees slot i and moves back the entries after it that a probe
// would no longer reach (backward-shift deletion: no tombstones).
func (t *table) deleteAt(i int) {
	mask := len(t.slots) - 1
	t.slots[i] = tableSlot{}
	t.n--
	for j := (i + 1) & mask; t.slots[j].ie != nil; j = (j + 1) & mask {
		k := t.home(t.slots[j].hash)
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j].
		if i <= j && (k <= i || k > j) || i > j && k <= i && k > j {
			t.slots[i], t.slots[j] = t.slots[j], tableSlot{}
			i = j
		}
	}
}

// sweep calls keep on every entry and deletes those it returns false for.
// An entry may be passed to keep more than once (a deletion can move one
// already kept into the slot being looked at), so keep must be idempotent.
func (t *table) sweep(keep func(*idEntry) bool) {
	for i := 0; i < len(t.slots); {
		if ie := t.slots[i].ie; ie != nil && !keep(ie) {
			t.deleteAt(i) // an entry from further on may now be at i
			continue
		}
		i++
	}
}
