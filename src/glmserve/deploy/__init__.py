"""Ways to run the one HTTP app beyond a single process: ``deploy.ray`` (Ray Serve replicas).

Needs ``pip install '.[ray]'`` (in the checkout); nothing here is imported by the single server."""
