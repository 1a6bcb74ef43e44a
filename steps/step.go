package steps

import (
	"github.com/jetway-ci/jetway/wire"
)

// key identifies a step: handles are unique within a team.
type key struct{ team, handle string }

func isEnd(typ string) bool { return typ == wire.EventExited || typ == wire.EventFailed }
