package steps
