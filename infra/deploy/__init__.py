"""The deployment for scale: a Helm chart (helm/parley) and what it is generated or validated from."""
