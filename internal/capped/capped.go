// Package capped keeps the start of what is written to it: a command's
// stderr, quoted in its error, whatever its length.
package capped

import "sync"

// Buffer keeps the first Limit bytes written to it and drops the rest;
// writes never fail. It is safe for concurrent use.
type Buffer struct {
	Limit int

	mu sync.Mutex
	b  []byte
}

func (c *Buffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.Limit - len(c.b); room > 0 {
		c.b = append(c.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// String is what was kept.
func (c *Buffer) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.b)
}

// Bytes is a copy of what was kept.
func (c *Buffer) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.b...)
}
