package targets

import "time"

// This file holds how a target's lifecycle is recorded in its cluster (the
// data of its record ConfigMap) and what the registry makes of it: land,
// retire and prune decisions, read from the target cluster's record or,
// for a prune of an unreachable target, made by this replica.

// Keys of the lifecycle record's data.
const (
	recordState      = "state"
	recordSince      = "since"
	recordConfigHash = "config-sha256"
	// recordPruned holds the hash of the configuration that was pruned.
	recordPruned = "pruned-config-sha256"
	// recordReleased holds when a web node released the target's worker.
	recordReleased = "concourse-released"
)

// DecodeLifecycle reads a lifecycle record's data.
func DecodeLifecycle(data map[string]string) Lifecycle {
	since, _ := time.Parse(time.RFC3339, data[recordSince])
	released, _ := time.Parse(time.RFC3339, data[recordReleased])
	return Lifecycle{State: State(data[recordState]), Since: since,
		ConfigHash: data[recordConfigHash], PrunedHash: data[recordPruned], Released: released}
}

// Data is the lifecycle record's data for l; empty fields are left out,
// and so is what only the registry derives (Holding, Overdue, Problem).
func (l Lifecycle) Data() map[string]string {
	data := map[string]string{}
	for key, v := range map[string]string{recordState: string(l.State), recordConfigHash: l.ConfigHash, recordPruned: l.PrunedHash} {
		if v != "" {
			data[key] = v
		}
	}
	if !l.Since.IsZero() {
		data[recordSince] = l.Since.UTC().Format(time.RFC3339)
	}
	if !l.Released.IsZero() {
		data[recordReleased] = l.Released.UTC().Format(time.RFC3339)
	}
	return data
}

// hidden reports whether the target is forgotten: pruned by this replica,
// or pruned or retired (as recorded in its cluster) with the configuration
// it still has.
func (rec *record) hidden() bool {
	if rec.pruned {
		return true
	}
	if rec.cfg == nil {
		return false
	}
	life := rec.recorded()
	return (life.State == StateRetired && life.ConfigHash == rec.cfg.hash) ||
		(life.PrunedHash != "" && life.PrunedHash == rec.cfg.hash)
}

// recordProblem says what is wrong with the target's lifecycle record.
func (rec *record) recordProblem() error {
	if rec.target == nil {
		return nil
	}
	return rec.target.RecordProblem()
}

// recorded is the lifecycle in the target's cluster, as its watch last saw
// it; zero before the first list or without a usable configuration.
func (rec *record) recorded() Lifecycle {
	if rec.target == nil {
		return Lifecycle{}
	}
	life, _ := rec.target.Lifecycle()
	return life
}

// Prunable returns a listed target that may be pruned (any but a running
// one: ErrRunning) and whether its cluster answered the last check, so the
// prune can be recorded there.
func (r *Registry) Prunable(name string) (t *Target, reachable bool, err error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rec, ok := r.records[name]
	if !ok || rec.hidden() {
		return nil, false, ErrNotFound
	}
	if r.status(rec).State == StateRunning {
		return nil, false, ErrRunning
	}
	return rec.target, rec.target != nil && rec.checked && rec.health.Err == nil, nil
}

// Prune makes this replica alone forget a target that is not running,
// until a check of it next succeeds: for targets whose cluster cannot
// record the prune. It returns ErrNotFound or ErrRunning.
func (r *Registry) Prune(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.records[name]
	if !ok || rec.hidden() {
		return ErrNotFound
	}
	if r.status(rec).State == StateRunning {
		return ErrRunning
	}
	rec.pruned = true
	r.opts.Logger.Info("target pruned on this replica", "target", name)
	return nil
}

// Find returns the status of a target that is listed or pruned: what
// resume may act on. Retired and unknown targets are ErrNotFound.
func (r *Registry) Find(name string) (Status, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rec, ok := r.records[name]
	if !ok {
		return Status{}, ErrNotFound
	}
	if life := rec.recorded(); rec.cfg != nil && life.State == StateRetired && life.ConfigHash == rec.cfg.hash {
		return Status{}, ErrNotFound
	}
	return r.status(rec), nil
}

// Unprune drops this replica's own prune of a target (an operator resumed
// it); what its cluster records is read as usual.
func (r *Registry) Unprune(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec, ok := r.records[name]; ok {
		rec.pruned = false
	}
}
