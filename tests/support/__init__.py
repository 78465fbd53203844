"""Test scaffolding that is no part of seal-lite: scripted policies for real ``seal-lite run`` processes
(scripted_run), the mutation corpus of near-miss BFCL trajectories (mutations), and τ²'s reference agents
(tau2_roles). Tests import it as ``tests.support`` (pyproject.toml puts the repository root on pytest's path);
benchmarks and the scripts tests start add the repository root to ``sys.path`` first."""
