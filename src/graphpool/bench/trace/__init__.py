"""`graphpool bench trace`: a serving trace replayed through the engine under several graph policies."""
