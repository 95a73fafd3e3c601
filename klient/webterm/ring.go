package webterm

// ring keeps the last len(buf) bytes written to it: a session's scrollback, replayed to every
// viewer that attaches.
type ring struct {
	buf   []byte
	start int // index of the oldest byte
	n     int // bytes held
}

func newRing(size int) *ring { return &ring{buf: make([]byte, size)} }

// Write appends p, dropping the oldest bytes beyond the capacity.
func (r *ring) Write(p []byte) {
	size := len(r.buf)
	if size == 0 {
		return
	}
	if len(p) >= size {
		copy(r.buf, p[len(p)-size:])
		r.start, r.n = 0, size
		return
	}
	end := (r.start + r.n) % size
	k := copy(r.buf[end:], p)
	copy(r.buf, p[k:])
	r.n += len(p)
	if r.n > size {
		r.start = (r.start + r.n - size) % size
		r.n = size
	}
}

// Bytes returns a copy of what the ring holds, oldest first, starting at a UTF-8 character
// boundary (a replay must not begin with half a character).
func (r *ring) Bytes() []byte {
	out := make([]byte, r.n)
	k := copy(out, r.buf[r.start:min(r.start+r.n, len(r.buf))])
	copy(out[k:], r.buf[:r.n-k])
	i := 0
	for i < len(out) && i < 3 && out[i]&0xC0 == 0x80 { // continuation bytes
		i++
	}
	return out[i:]
}
