"""The response cache: answers repeated and paraphrased questions without running the model.

Import from the modules (`from cache.response_cache import ResponseCache`): this package file
stays empty, so that logging can import `cache.pii` without loading FAISS and the embedders.
"""
