"""Durable state shared by the parts of a deployment, each behind one small interface.

Today: the async check queue (`queue.CheckQueue`), kept in SQLite next to the audit trail. The
scale-out work adds a Redis Streams implementation of the same interface.
"""
