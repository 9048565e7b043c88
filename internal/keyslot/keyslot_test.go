package keyslot

import "testing"

func TestOf(t *testing.T) {
	// Values CLUSTER KEYSLOT gives (cmd/throttlekit's Cluster test checks
	// more against a real server).
	for key, want := range map[string]int{"foo": 12182, "hello": 866, "": 0} {
		if got := Of(key); got != want {
			t.Errorf("Of(%q) = %d, want %d", key, got, want)
		}
	}
	if Of("user1000") != Of("{user1000}.following") {
		t.Error("a hash tag does not pick the slot")
	}
	if Of("{}x") != int(CRC16("{}x")%Slots) {
		t.Error("an empty tag does not hash the whole key")
	}
	if Of("a{b}c{d}") != Of("b") {
		t.Error("the first tag does not win")
	}
}

func TestCRC16(t *testing.T) {
	// The check value of CRC-16/XMODEM.
	if got := CRC16("123456789"); got != 0x31C3 {
		t.Errorf("CRC16 = %#x, want 0x31c3", got)
	}
}
