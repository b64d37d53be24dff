"""Ways to run the one HTTP app beyond a single process: ``deploy.ray`` (Ray Serve replicas).

Needs ``pip install 'glmserve[ray]'``; nothing here is imported by the single server."""
