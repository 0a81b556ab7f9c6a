"""The Genie bundle: assembled from the variant's binaries (:mod:`.bundle`, writing :mod:`.manifest` and
:mod:`.metadata`, and with ``bundle.embedding: lut`` the table of :mod:`.embedding_table`, part 1's lookups of
:mod:`.embedding_part`), and checked as Genie loads one (:mod:`.check_bundle`, with :mod:`.check_keys`,
:mod:`.check_vendor` and :mod:`.check_embedding`, each reading the bundle through :mod:`.bundle_files`).
"""
