"""fairseq adapters: importing this module registers the SReT architectures with fairseq."""
