// Package targets turns a directory of kubeconfigs into a live,
// permission-checked set of targets (Concourse workers). Its code arrives
// with the targets work (issue 3); this comment records the package's place
// in the layout.
package targets
