"""Models the project builds itself, for tests and smoke runs: never part of a real run's training path.

`tiny` builds a random transformers model of a given architecture (`tiny`, `tiny-llama`, ...); `warm`
fits one briefly to math-2agent's formats (`tiny-math`, the smoke preset's model). They live apart from
`engines` because they are fixtures, not engine building: `warm` imports drmas_envs and trains, and
`engines.resolve` reaches them only when a config names a `tiny*` model. Named after `numpy.testing` /
`torch.testing`: helpers a package ships for its users' tests.
"""
