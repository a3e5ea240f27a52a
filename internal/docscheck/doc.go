// Package docscheck holds the checks of the repository's Markdown pages
// (README.md and docs/) that can be written as tests: what a renderer
// would show other than what the page means.
package docscheck
