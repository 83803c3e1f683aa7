package rivermw

// InlineWait is inlineWait, for the package's external tests.
var InlineWait = inlineWait
