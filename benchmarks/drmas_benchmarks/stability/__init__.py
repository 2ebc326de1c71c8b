"""The stability benchmark: `run` drives the training runs, `report` and `heldout` summarise them,
`synthetic` runs the analysis without a trainer, `analysis` holds the pure functions they share."""
