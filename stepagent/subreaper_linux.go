package stepagent

import "syscall"

// setSubreaper makes the supervisor adopt what the process leaves behind,
// so that orphans of the step are reaped by it, not left as zombies.
func setSubreaper() {
	const prSetChildSubreaper = 36
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}
