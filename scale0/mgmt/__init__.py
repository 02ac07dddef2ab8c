"""The broker's HTTP management server: JSON API, web page and Prometheus /metrics."""
