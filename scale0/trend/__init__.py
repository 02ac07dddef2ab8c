"""Trending: the broker's event log (schema, writer) and the PySpark job that reads it.

``schema`` and ``eventlog`` are pure Python (a broker imports them without PySpark); ``synth``
generates synthetic logs; ``job`` and ``report`` need the ``trend`` extra (pyspark, matplotlib).
"""
