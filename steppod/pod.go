package steppod

// Containers of a step pod: the step's own, whose pid 1 is the step
// agent, and the volume sidecar, which serves the pod's volumes.
const (
	StepContainer    = "step"
	SidecarContainer = "volumes"
)
