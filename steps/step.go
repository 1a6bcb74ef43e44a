package steps

import (
	"unicode/utf8"

	"github.com/jetway-ci/jetway/wire"
)

// withData sets a chunk of output: Data when it is UTF-8, else
// DataBase64.
func withData(e wire.Event, b []byte) wire.Event {
	if utf8.Valid(b) {
		e.Data = string(b)
	} else {
		e.DataBase64 = b
	}
	return e
}

// key identifies a step: handles are unique within a team.
type key struct{ team, handle string }

func isEnd(typ string) bool { return typ == wire.EventExited || typ == wire.EventFailed }
