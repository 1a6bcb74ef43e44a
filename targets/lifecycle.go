package targets

// This file holds what the lifecycle controller records in the registry:
// land, retire and prune decisions, read from the target cluster or made
// by this replica.

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
	return (rec.life.State == StateRetired && rec.life.ConfigHash == rec.cfg.hash) ||
		(rec.life.PrunedHash != "" && rec.life.PrunedHash == rec.cfg.hash)
}

// SetLifecycle records what the lifecycle controller read for a target,
// made with cfg; results for a replaced configuration are dropped.
func (r *Registry) SetLifecycle(name string, cfg *Config, life Lifecycle) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.records[name]
	if !ok || rec.cfg != cfg {
		return
	}
	if rec.life.State != life.State {
		r.opts.Logger.Info("target lifecycle", "target", name, "state", string(life.State), "was", string(rec.life.State))
	}
	rec.life = life
}

// SetLifecycleError records why the lifecycle of a target (with cfg) could
// not be read or advanced; the next successful SetLifecycle clears it.
func (r *Registry) SetLifecycleError(name string, cfg *Config, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec, ok := r.records[name]; ok && rec.cfg == cfg {
		rec.life.Problem = err.Error()
	}
}

// Prunable returns the configuration of a listed target that may be pruned
// (any but a running one: ErrRunning) and whether its cluster answered the
// last check, so the prune can be recorded there.
func (r *Registry) Prunable(name string) (cfg *Config, reachable bool, err error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rec, ok := r.records[name]
	if !ok || rec.hidden() {
		return nil, false, ErrNotFound
	}
	if rec.status().State == StateRunning {
		return nil, false, ErrRunning
	}
	return rec.cfg, rec.cfg != nil && rec.checked && rec.health.Err == nil, nil
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
	if rec.status().State == StateRunning {
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
	if !ok || (rec.cfg != nil && rec.life.State == StateRetired && rec.life.ConfigHash == rec.cfg.hash) {
		return Status{}, ErrNotFound
	}
	return rec.status(), nil
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
