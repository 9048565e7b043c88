package rollout

import (
	"encoding/binary"
	"fmt"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"math/bits"
	"sync/atomic"
)

// Side names one of the two backends of a rollout.
type Side int

const (
	// SideOld is the backend being migrated away from.
	SideOld Side = iota
	// SideNew is the backend being migrated to.
	SideNew
)

// String returns "old" or "new".
func (s Side) String() string {
	if s == SideNew {
		return "new"
	}
	return "old"
}

// other returns the opposite side.
func (s Side) other() Side { return 1 - s }

// Buckets is the number of buckets identifiers hash into: one per percent,
// as in Unleash.
const Buckets = 100

// Bucket returns the bucket, 1 to Buckets, that identifier falls in for
// groupID. It is Unleash's normalisation for gradual rollouts: the 32-bit
// murmur3 hash (seed 0) of groupID + ":" + identifier, modulo 100, plus one.
// An identifier is on the new side at percentage p iff p > 0 and its bucket
// is at most p, so its side depends only on the pair (groupID, identifier)
// and on p, and it changes at most once as p moves from 0 to 100.
func Bucket(groupID, identifier string) int {
	// A stack buffer keeps the hot path free of allocations for the usual
	// short identifiers.
	var stack [192]byte
	buf := stack[:0]
	if n := len(groupID) + 1 + len(identifier); n > len(stack) {
		buf = make([]byte, 0, n)
	}
	buf = append(buf, groupID...)
	buf = append(buf, ':')
	buf = append(buf, identifier...)
	return int(murmur3x86_32(buf)%Buckets) + 1
}

// murmur3x86_32 is MurmurHash3's x86 32-bit variant with seed 0, the hash
// Unleash uses (github.com/twmb/murmur3 SeedNew32(0)). It is written out
// here so that rollout depends on no hashing package, and the tests check it
// against the Unleash client's own evaluation.
func murmur3x86_32(data []byte) uint32 {
	const (
		c1 = 0xcc9e2d51
		c2 = 0x1b873593
	)
	var h uint32
	n := len(data)
	blocks := n / 4
	for i := 0; i < blocks; i++ {
		k := binary.LittleEndian.Uint32(data[4*i:])
		k *= c1
		k = bits.RotateLeft32(k, 15)
		k *= c2
		h ^= k
		h = bits.RotateLeft32(h, 13)
		h = h*5 + 0xe6546b64
	}
	tail := data[4*blocks:]
	var k uint32
	switch len(tail) {
	case 3:
		k ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		k ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		k ^= uint32(tail[0])
		k *= c1
		k = bits.RotateLeft32(k, 15)
		k *= c2
		h ^= k
	}
	h ^= uint32(n)
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// Split says which identifiers the new backend serves: those whose Bucket
// for the split's group ID is at most its percentage. A Split is immutable;
// a FlagSource publishes a new one to change the split.
type Split struct {
	percent int
	groupID string
	killed  bool
}

// NewSplit returns the split that sends percent (0 to 100) of identifiers,
// chosen by their Bucket for groupID, to the new backend. The error wraps
// driver.ErrInvalidOption.
func NewSplit(percent int, groupID string) (*Split, error) {
	if percent < 0 || percent > 100 {
		return nil, driver.Errorf("%w: rollout: %d is outside 0..100", driver.ErrInvalidOption, percent)
	}
	return &Split{percent: percent, groupID: groupID}, nil
}

// KillSwitch returns the split of a flag that is switched off: every
// identifier on the old backend, whatever the percentage.
func KillSwitch(groupID string) *Split { return &Split{groupID: groupID, killed: true} }

// Percent returns the percentage of identifiers the new backend serves.
func (s *Split) Percent() int { return s.percent }

// GroupID returns the group ID identifiers are hashed with.
func (s *Split) GroupID() string { return s.groupID }

// Killed reports that the split comes from a flag switched off (the kill
// switch): every identifier is on the old backend whatever the percentage
// was.
func (s *Split) Killed() bool { return s.killed }

// Side returns the backend that serves identifier under this split.
func (s *Split) Side(identifier string) Side {
	switch {
	case s.killed || s.percent <= 0:
		return SideOld
	case s.percent >= 100:
		return SideNew
	case Bucket(s.groupID, identifier) <= s.percent:
		return SideNew
	}
	return SideOld
}

// String describes the split, e.g. "25% new (group api-limits)".
func (s *Split) String() string {
	if s.killed {
		return "off: 0% new (kill switch)"
	}
	return fmt.Sprintf("%d%% new (group %s)", s.percent, s.groupID)
}

// FlagSource tells a rollout Backend which identifiers the new backend
// serves.
//
// Split is called on every decision, so it must not block, take a lock or
// send on a channel: a source refreshes its split in the background and
// publishes each new one atomically (an atomic.Pointer load is the whole of
// a call). It returns nil until the source has had an answer; the Backend
// then applies its configured default side.
//
// A source keeps the last split it had while its origin is unreachable.
type FlagSource interface {
	Split() *Split
}

// DefaultStaticGroupID is the group ID of a StaticSource unless
// WithStaticGroupID says otherwise.
const DefaultStaticGroupID = "throttlekit-rollout"

// StaticSource is a FlagSource holding a percentage set in the program,
// changeable at run time. It always has an answer. Set is atomic and may be
// called concurrently with decisions.
type StaticSource struct {
	groupID string
	split   atomic.Pointer[Split]
}

// StaticOption configures a StaticSource (NewStaticSource).
type StaticOption interface {
	apply(*StaticSource) error
}

// staticOptionFunc adapts a function to StaticOption.
type staticOptionFunc func(*StaticSource) error

func (f staticOptionFunc) apply(s *StaticSource) error { return f(s) }

// WithStaticGroupID sets the group ID identifiers are hashed with; the
// default is DefaultStaticGroupID. Give it the name (the group ID) of an
// Unleash toggle to move from a static percentage to that toggle without
// moving any identifier.
func WithStaticGroupID(groupID string) StaticOption {
	return staticOptionFunc(func(s *StaticSource) error { s.groupID = groupID; return nil })
}

// NewStaticSource returns a source that sends percent (0 to 100) of
// identifiers to the new backend. The error wraps driver.ErrInvalidOption.
func NewStaticSource(percent int, opts ...StaticOption) (*StaticSource, error) {
	s := &StaticSource{groupID: DefaultStaticGroupID}
	for _, opt := range opts {
		if opt == nil {
			return nil, driver.Errorf("%w: rollout: nil StaticOption", driver.ErrInvalidOption)
		}
		if err := opt.apply(s); err != nil {
			return nil, err
		}
	}
	if err := s.Set(percent); err != nil {
		return nil, err
	}
	return s, nil
}

// Set changes the percentage. Raising it moves identifiers only from the old
// backend to the new one; lowering it only moves them back. Set(0) is the
// kill switch. The error wraps driver.ErrInvalidOption and leaves the split as it
// was.
func (s *StaticSource) Set(percent int) error {
	sp, err := NewSplit(percent, s.groupID)
	if err != nil {
		return err
	}
	s.split.Store(sp)
	return nil
}

// Percent returns the current percentage; a zero StaticSource, never Set,
// reports 0.
func (s *StaticSource) Percent() int {
	if sp := s.split.Load(); sp != nil {
		return sp.percent
	}
	return 0
}

// Split returns the current split.
func (s *StaticSource) Split() *Split { return s.split.Load() }

var _ FlagSource = (*StaticSource)(nil)
